package main

import (
	"os/exec"
	"runtime/debug"
	"strings"
	"testing"
)

func TestVersionOfReadsModuleAndRevision(t *testing.T) {
	tests := []struct {
		name string
		info string // as `go version -m` prints it
		want buildVersion
	}{
		{
			name: "tagged install",
			info: "go\tgo1.26.8\npath\tgithub.com/policyd/policyd/cmd/policyd\nmod\tgithub.com/policyd/policyd\tv0.3.0\th1:x=\n" +
				"build\tvcs=git\nbuild\tvcs.revision=a70ba671262d8adcdf75f0293ab3830f61fc4c57\nbuild\tvcs.modified=false\n",
			want: buildVersion{Version: "v0.3.0", Revision: "a70ba671262d8adcdf75f0293ab3830f61fc4c57", GoVersion: "go1.26.8"},
		},
		{
			name: "dirty checkout",
			info: "go\tgo1.26.8\npath\tgithub.com/policyd/policyd/cmd/policyd\nmod\tgithub.com/policyd/policyd\t(devel)\t\n" +
				"build\tvcs.revision=ebe1f99\nbuild\tvcs.modified=true\n",
			want: buildVersion{Version: "(devel)", Revision: "ebe1f99", Modified: true, GoVersion: "go1.26.8"},
		},
		{
			name: "built with -buildvcs=false",
			info: "go\tgo1.26.8\npath\tgithub.com/policyd/policyd/cmd/policyd\nmod\tgithub.com/policyd/policyd\t(devel)\t\n",
			want: buildVersion{Version: "(devel)", Revision: "unknown", GoVersion: "go1.26.8"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			info, err := debug.ParseBuildInfo(tt.info)
			if err != nil {
				t.Fatal(err)
			}
			if got := versionOf(info); got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
	if got, want := (buildVersion{Version: "v0.3.0", Revision: "abc", Modified: true, GoVersion: "go1.26.8"}).String(),
		"policyd v0.3.0 (revision abc-dirty, go1.26.8)"; got != want {
		t.Errorf("String: got %q, want %q", got, want)
	}
}

// TestVersionCommandMatchesTheBinary runs the built binary's `version` and
// `--version` and compares them with what the Go toolchain reads from the
// same file.
func TestVersionCommandMatchesTheBinary(t *testing.T) {
	raw, err := exec.Command("go", "version", "-m", binary).Output()
	if err != nil {
		t.Fatal(err)
	}
	// `go version -m` prints "FILE: goX" first; ParseBuildInfo wants "go\tgoX".
	first, rest, _ := strings.Cut(string(raw), "\n")
	_, goVersion, _ := strings.Cut(first, ": ")
	lines := []string{"go\t" + goVersion}
	for _, l := range strings.Split(strings.TrimSpace(rest), "\n") {
		lines = append(lines, strings.TrimPrefix(l, "\t"))
	}
	info, err := debug.ParseBuildInfo(strings.Join(lines, "\n") + "\n")
	if err != nil {
		t.Fatalf("parsing go version -m: %v\n%s", err, raw)
	}
	if info.Main.Path != "github.com/policyd/policyd" {
		t.Fatalf("go version -m read no main module: %+v", info)
	}
	want := versionOf(info).String() + "\n"
	for _, args := range [][]string{{"version"}, {"--version"}} {
		out, err := exec.Command(binary, args...).Output()
		if err != nil {
			t.Fatalf("policyd %v: %v", args, err)
		}
		if string(out) != want {
			t.Errorf("policyd %v: got %q, want %q", args, out, want)
		}
	}
}
