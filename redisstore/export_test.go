package redisstore

// CheckSlots is checkSlots, for the external tests that start a Cluster.
var CheckSlots = checkSlots
