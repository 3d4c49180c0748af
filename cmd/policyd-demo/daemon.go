package main

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/policyd/policyd/breakerstore"
	"github.com/policyd/policyd/clients/go/policyclient"
	"github.com/policyd/policyd/server"
)

// startEmbedded starts policyd in the process on a temporary state file and
// a loopback port; stop drains it and removes the file.
func startEmbedded(log *slog.Logger) (addr, path string, stop func(), err error) {
	dir, err := os.MkdirTemp("", "policyd-demo-")
	if err != nil {
		return "", "", nil, err
	}
	path = filepath.Join(dir, "policyd.db")
	store, err := breakerstore.Open(breakerstore.Options{Path: path, Logger: log})
	if err != nil {
		os.RemoveAll(dir)
		return "", "", nil, err
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		store.Close()
		os.RemoveAll(dir)
		return "", "", nil, err
	}
	srv := server.New(store, server.Config{Logger: log})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	stop = func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		if err := <-served; err != nil {
			log.Warn("embedded policyd", "err", err)
		}
		if err := store.Close(); err != nil {
			log.Warn("closing the demo's state file", "err", err)
		}
		os.RemoveAll(dir)
	}
	return lis.Addr().String(), path, stop, nil
}

// adminCredentials returns the dial options for a running policyd's admin
// calls, as policyd's admin commands find the token: $POLICYD_TOKEN, else
// the first line of tokenFile when it exists, else none (plaintext
// either way: the demo talks to loopback).
func adminCredentials(tokenFile string) ([]grpc.DialOption, error) {
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	tok := os.Getenv("POLICYD_TOKEN")
	if tok == "" {
		raw, err := os.ReadFile(tokenFile)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return opts, nil
		case err != nil:
			return nil, err
		}
		tok, _, _ = strings.Cut(strings.TrimSpace(string(raw)), "\n")
	}
	if tok = strings.TrimSpace(tok); tok != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(policyclient.BearerToken(tok)))
	}
	return opts, nil
}
