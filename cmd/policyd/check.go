package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/policyd/policyd/breakerstore"
)

func checkCmd() *cobra.Command {
	var db string
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
and exits 1.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := breakerstore.Check(db, wait); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: ok\n", db)
			return nil
		},
	}
	cmd.Flags().StringVar(&db, "db", "policyd.db", "the state file to check")
	cmd.Flags().DurationVar(&wait, "lock-timeout", time.Second, "how long to wait for the file's lock")
	return cmd
}
