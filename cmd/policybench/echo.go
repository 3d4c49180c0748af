package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The echo is the yardstick: a bare grpc-go server (no interceptors, no
// options) that answers a 32-byte message with itself, unary and over a
// bidirectional stream. It runs in a child process (policybench
// echo-server) so its CPU can be read from /proc like policyd's.

const (
	echoUnaryMethod  = "/policybench.v1.Echo/Unary"
	echoStreamMethod = "/policybench.v1.Echo/Stream"
	echoPayload      = 32
)

var echoDesc = grpc.ServiceDesc{
	ServiceName: "policybench.v1.Echo",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Unary",
		Handler: func(_ any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			in := new(wrapperspb.BytesValue)
			if err := dec(in); err != nil {
				return nil, err
			}
			return in, nil
		},
	}},
	Streams: []grpc.StreamDesc{{
		StreamName:    "Stream",
		ServerStreams: true,
		ClientStreams: true,
		Handler: func(_ any, stream grpc.ServerStream) error {
			for {
				m := new(wrapperspb.BytesValue)
				if err := stream.RecvMsg(m); err != nil {
					if errors.Is(err, io.EOF) {
						return nil
					}
					return err
				}
				if err := stream.SendMsg(m); err != nil {
					return err
				}
			}
		},
	}},
}

// newEchoServer returns a bare gRPC server with the echo registered.
func newEchoServer() *grpc.Server {
	gs := grpc.NewServer()
	gs.RegisterService(&echoDesc, struct{}{})
	return gs
}

// runEchoServer is the hidden echo-server subcommand: it serves on a
// loopback port, prints "listening ADDR" on stdout, and stops when its
// stdin closes (the parent went away) or on SIGINT/SIGTERM.
func runEchoServer() error {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	gs := newEchoServer()
	fmt.Printf("listening %s\n", lis.Addr())
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		gs.Stop()
	}()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() { <-sig; gs.Stop() }()
	if err := gs.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}

// echoChild is an echo server in a child process.
type echoChild struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	addr  string
}

// startEchoChild re-executes this binary as `policybench echo-server`.
func startEchoChild() (*echoChild, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, "echo-server")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &echoChild{cmd: cmd, stdin: stdin}
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			line <- sc.Text()
		}
		close(line)
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case l, ok := <-line:
		addr, found := strings.CutPrefix(l, "listening ")
		if !ok || !found {
			c.stop()
			return nil, fmt.Errorf("echo server child said %q", l)
		}
		c.addr = addr
	case <-time.After(10 * time.Second):
		c.stop()
		return nil, errors.New("echo server child did not start within 10s")
	}
	return c, nil
}

func (c *echoChild) pid() int { return c.cmd.Process.Pid }

// stop closes the child's stdin, which ends it, and reaps it.
func (c *echoChild) stop() {
	_ = c.stdin.Close()
	done := make(chan struct{})
	go func() { _ = c.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = c.cmd.Process.Kill()
		<-done
	}
}

// echoPayloadMsg returns a fresh 32-byte message.
func echoPayloadMsg() *wrapperspb.BytesValue {
	return &wrapperspb.BytesValue{Value: []byte(strings.Repeat("x", echoPayload))}
}
