package redisstore

import (
	"context"
	"net"
	"time"
)

// Dialer wraps dial, the dialer of a go-redis client's options
// (redis.NewDialer(opts) for its default one), for the Dialer option of
// the client a Store is given: a dial that fails returns a connection
// whose every read and write fails with the dial's error, not the error.
//
// go-redis's pool stops dialing after PoolSize failed dials in a row: it
// fails every call at once with the last dial error until a background
// dial, tried once a second, succeeds. After a restart of Redis that kept
// a replica from reconnecting for up to a second, and its changes stream
// with it: an admin write made through another replica reached it that
// much later (865 ms in policybench replicas, kill-redis). Reported on
// the connection instead, the dial's error fails the call that needed it
// as before (the Store's engine breaker counts it, and bounds how often a
// down engine is tried), the pool drops the connection, and the next call
// dials again. It is safe for concurrent use if dial is.
func Dialer(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return failedConn{err}, nil
		}
		return c, nil
	}
}

// failedConn is a connection that was never made: every read and write
// fails with the dial's error.
type failedConn struct{ err error }

func (c failedConn) Read([]byte) (int, error)         { return 0, c.err }
func (c failedConn) Write([]byte) (int, error)        { return 0, c.err }
func (c failedConn) Close() error                     { return nil }
func (c failedConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c failedConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c failedConn) SetDeadline(time.Time) error      { return nil }
func (c failedConn) SetReadDeadline(time.Time) error  { return nil }
func (c failedConn) SetWriteDeadline(time.Time) error { return nil }
