package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// buildVersion is what a policyd binary knows about its own build: the
// module version ("(devel)" for a build from a checkout, a tag such as
// v0.3.0 for `go install ...@v0.3.0`), the VCS revision ("unknown" when the
// build recorded none, e.g. with -buildvcs=false), whether the tree had
// uncommitted changes, and the Go release that built it.
type buildVersion struct {
	Version   string `json:"version"`
	Revision  string `json:"revision"`
	Modified  bool   `json:"modified"`
	GoVersion string `json:"go_version"`
}

// readBuildVersion reads the binary's build information
// (runtime/debug.ReadBuildInfo).
func readBuildVersion() buildVersion {
	info, _ := debug.ReadBuildInfo()
	return versionOf(info)
}

// versionOf picks the version fields out of info, which may be nil.
func versionOf(info *debug.BuildInfo) buildVersion {
	v := buildVersion{Version: "(devel)", Revision: "unknown", GoVersion: runtime.Version()}
	if info == nil {
		return v
	}
	if info.Main.Version != "" {
		v.Version = info.Main.Version
	}
	if info.GoVersion != "" {
		v.GoVersion = info.GoVersion
	}
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Revision = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
	return v
}

// String is the one line `policyd version` and `policyd --version` print.
func (v buildVersion) String() string {
	rev := v.Revision
	if v.Modified {
		rev += "-dirty"
	}
	return fmt.Sprintf("policyd %s (revision %s, %s)", v.Version, rev, v.GoVersion)
}

func versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version, VCS revision and Go release of this binary",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintln(cmd.OutOrStdout(), readBuildVersion())
			return err
		},
	}
}
