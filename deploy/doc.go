// Package deploy holds what it takes to run policyd outside a checkout and
// the tests that keep it honest: the container image builder (./image), the
// systemd unit (systemd/), the Kubernetes manifests for the single-replica
// bbolt profile and the N-replica Redis profile (kubernetes/), the Grafana
// dashboard (grafana/) and the Prometheus alert rules (prometheus/).
//
// It is its own module so that the daemon's module never depends on
// go-containerregistry or the Kubernetes API types. `scripts/test` runs its
// tests: the image is built and inspected, the unit is checked with
// systemd-analyze where it is installed, and every manifest is decoded
// strictly into the Kubernetes API types.
package deploy
