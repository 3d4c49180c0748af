package redisstore_test

import (
	"github.com/policyd/policyd/redisstore"
	"github.com/policyd/policyd/server"
)

// The Redis engine is a server.Store: the handlers run on it unchanged.
var _ server.Store = (*redisstore.Store)(nil)

// It takes a NextDelay in one function call (policyd_nextdelay).
var _ server.OneCallNextDelay = (*redisstore.Store)(nil)
