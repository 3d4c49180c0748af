package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/policyd/policyd/breakerstore"
	"github.com/policyd/policyd/redisstore"
)

func checkCmd() *cobra.Command {
	var db, store string
	var wait time.Duration
	cmd := &cobra.Command{
		Use:   "check",
		Short: "Verify a state file offline (bbolt page check, schema, every record)",
		Long: `Verify a state file without changing it: both bbolt meta pages, the file's
size against them, the freelist and every page of every bucket (read without
mapping the file, so a damaged one cannot crash the check), bbolt's own
consistency check, the schema version, and that every record decodes. The
daemon must not be running on the file (check takes its lock).

Prints "<file>: ok", or one line naming the file and every problem found,
and exits 1.

With a Redis --store it checks the schema version, that the library is
loaded on every master, and the type and numeric fields of every policyd
key, naming each key that is wrong.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			su, err := parseStore(store, db)
			if err != nil {
				return err
			}
			if su.redis != nil {
				defer su.redis.Close()
				ctx, cancel := context.WithTimeout(cmd.Context(), time.Minute)
				defer cancel()
				if err := redisstore.Check(ctx, su.redis); err != nil {
					return fmt.Errorf("%s: %w", su.shown, err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s: ok\n", su.shown)
				return nil
			}
			db = su.bboltPath
			if err := breakerstore.Check(db, wait); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: ok\n", db)
			return nil
		},
	}
	cmd.Flags().StringVar(&db, "db", "policyd.db", "the state file to check")
	cmd.Flags().StringVar(&store, "store", "", "the store to check instead, as policyd serve --store takes it (bbolt:PATH or a Redis URL)")
	cmd.Flags().DurationVar(&wait, "lock-timeout", time.Second, "how long to wait for the file's lock")
	return cmd
}
