// Command policyd is the retry-decision daemon and its command line:
// `policyd serve` (also plain `policyd`) runs the daemon; `policyd plan`
// plans retries into a window offline; the tenant, policy, breaker and run
// subcommands administer a running daemon.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

func main() {
	if err := rootCmd().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "policyd:", err)
		os.Exit(1)
	}
}

func rootCmd() *cobra.Command {
	serve := serveCmd()
	root := &cobra.Command{
		Use:   "policyd",
		Short: "A central retry-decision service for fleets of workers",
		Long: `policyd tells the workers of a fleet whether a failure is worth retrying,
how long to wait or why to stop, with one circuit breaker per upstream and one
retry budget per tenant shared by the whole fleet.

Run without a subcommand, policyd serves (as 'policyd serve').`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE:          serve.RunE,
		Version:       readBuildVersion().String(),
	}
	root.SetVersionTemplate("{{.Version}}\n")
	root.Flags().AddFlagSet(serve.Flags())
	root.AddCommand(serve, planCmd(), checkCmd(), versionCmd(), configCmd())
	root.AddCommand(adminCmds()...)
	return root
}
