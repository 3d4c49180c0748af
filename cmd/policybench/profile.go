package main

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime/debug"
	"runtime/pprof"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/policyd/policyd/breakerstore"
	"github.com/policyd/policyd/server"
)

// profileServerCmd is a hidden helper for finding where policyd spends its
// CPU without adding a pprof endpoint to the daemon: it serves the same
// services, wired as `policyd serve` wires them (authentication, load
// shedding, metrics, bbolt store), in a process that writes a CPU profile
// when it gets SIGINT or SIGTERM. Drive it with the sweep:
//
//	policybench profile-server --db /tmp/p.db --cpuprofile cpu.out &
//	policybench --addr ADDR --token-file /tmp/p.db.admin-token --phases nextdelay --concurrency 64 --duration 10s
//	kill %1; go tool pprof -top cpu.out
func profileServerCmd() *cobra.Command {
	var db, cpuprofile, sync string
	var gcPercent int
	var flush time.Duration
	cmd := &cobra.Command{
		Use:    "profile-server",
		Short:  "Serve policyd's services in-process and write a CPU profile on SIGTERM",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if _, ok := os.LookupEnv("GOGC"); !ok {
				debug.SetGCPercent(gcPercent) // as policyd serve's --gc-percent
			}
			mode := breakerstore.SyncGroup
			if sync == "always" {
				mode = breakerstore.SyncAlways
			}
			store, err := breakerstore.Open(breakerstore.Options{Path: db, FlushInterval: flush, Sync: mode})
			if err != nil {
				return err
			}
			defer store.Close()
			tok := "profile-token"
			if err := os.WriteFile(db+".admin-token", []byte(tok+"\n"), 0o600); err != nil {
				return err
			}
			metrics, err := server.NewMetrics(prometheus.NewRegistry(), server.MetricsOptions{})
			if err != nil {
				return err
			}
			log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
			gs := server.New(store, server.Config{Logger: log,
				Auth:    server.NewAuth(server.AuthConfig{AdminTokens: []string{tok}}),
				Shedder: server.NewShedder(4096, 100*time.Millisecond), Metrics: metrics},
				grpc.MaxRecvMsgSize(1<<20), grpc.MaxConcurrentStreams(1024))
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				return err
			}
			f, err := os.Create(cpuprofile)
			if err != nil {
				return err
			}
			if err := pprof.StartCPUProfile(f); err != nil {
				return err
			}
			fmt.Printf("listening %s pid %d\n", lis.Addr(), os.Getpid())
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			go func() { <-ctx.Done(); gs.Stop() }()
			err = gs.Serve(lis)
			pprof.StopCPUProfile()
			if cerr := f.Close(); cerr != nil {
				return cerr
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&db, "db", "profile.db", "state file")
	f.IntVar(&gcPercent, "gc-percent", 400, "the garbage collector's target, as policyd serve's --gc-percent (GOGC wins when set)")
	f.StringVar(&cpuprofile, "cpuprofile", "cpu.out", "where to write the CPU profile")
	f.StringVar(&sync, "sync", "group", "group or always")
	f.DurationVar(&flush, "flush-interval", 100*time.Millisecond, "group-commit interval")
	return cmd
}
