package main

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// buildDaemon builds policyd from the repository as the image wants it:
// static, with no cgo.
func buildDaemon(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "policyd")
	cmd := exec.Command("go", "build", "-trimpath", "-o", bin, "./cmd/policyd")
	cmd.Dir = filepath.Join("..", "..")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// TestImageRunsTheDaemonAsNonRoot builds the image into an OCI layout,
// reads it back, checks its config and its one layer, and runs the binary
// taken out of that layer.
func TestImageRunsTheDaemonAsNonRoot(t *testing.T) {
	bin := buildDaemon(t)
	dir := t.TempDir()
	oci, tarPath := filepath.Join(dir, "oci"), filepath.Join(dir, "policyd.tar")
	if err := run(bin, oci, tarPath, "policyd"); err != nil {
		t.Fatal(err)
	}

	p, err := layout.FromPath(oci)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 {
		t.Fatalf("layout holds %d manifests, want 1", len(im.Manifests))
	}
	desc := im.Manifests[0]
	if desc.MediaType != types.OCIManifestSchema1 {
		t.Errorf("manifest media type: got %s, want %s", desc.MediaType, types.OCIManifestSchema1)
	}
	if ref := desc.Annotations["org.opencontainers.image.ref.name"]; ref == "" {
		t.Errorf("ref name: got none, want the version's tag")
	}
	img, err := idx.Image(desc.Digest)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if got, want := c.Entrypoint, []string{"/policyd"}; !reflect.DeepEqual(got, want) {
		t.Errorf("entrypoint: got %q, want %q", got, want)
	}
	if got, want := c.Cmd, []string{"serve", "--listen=0.0.0.0:50051", "--db=/data/policyd.db", "--metrics-listen=0.0.0.0:9464"}; !reflect.DeepEqual(got, want) {
		t.Errorf("cmd: got %q, want %q", got, want)
	}
	if c.User != "65532:65532" {
		t.Errorf("user: got %q, want 65532:65532 (not root)", c.User)
	}
	if _, ok := c.Volumes["/data"]; !ok {
		t.Errorf("volumes: got %v, want /data", c.Volumes)
	}
	if cf.OS != "linux" || cf.Architecture == "" {
		t.Errorf("platform: got %s/%s", cf.OS, cf.Architecture)
	}
	if c.Labels["org.opencontainers.image.revision"] == "" || c.Labels["org.opencontainers.image.version"] == "" {
		t.Errorf("labels lack version or revision: %v", c.Labels)
	}

	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 1 {
		t.Fatalf("got %d layers, want 1", len(layers))
	}
	extracted := filepath.Join(dir, "extracted-policyd")
	files := readLayer(t, layers[0], map[string]string{"policyd": extracted})
	if got, want := files, map[string]tar.Header{
		"data/":   {Typeflag: tar.TypeDir, Mode: 0o700, Uid: 65532, Gid: 65532},
		"policyd": {Typeflag: tar.TypeReg, Mode: 0o755},
	}; !reflect.DeepEqual(got, want) {
		t.Errorf("layer: got %+v, want %+v (and no shell or libc)", got, want)
	}

	// The binary runs on its own (no loader, no shell) and answers version.
	out, err := exec.Command(extracted, "version").Output()
	if err != nil {
		t.Fatalf("policyd version from the layer: %v", err)
	}
	if !strings.HasPrefix(string(out), "policyd ") {
		t.Errorf("policyd version: got %q", out)
	}

	// The default command's flags are ones this binary's serve knows.
	help, err := exec.Command(extracted, "serve", "--help").Output()
	if err != nil {
		t.Fatalf("policyd serve --help from the layer: %v", err)
	}
	for _, a := range c.Cmd[1:] {
		flag, _, _ := strings.Cut(a, "=")
		if !strings.Contains(string(help), "      "+flag+" ") {
			t.Errorf("the image's command passes %s, which policyd serve does not know", flag)
		}
	}

	// The tarball docker and podman load holds the same image.
	tb, err := tarball.ImageFromPath(tarPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	d1, _ := img.ConfigName()
	d2, err := tb.ConfigName()
	if err != nil || d1 != d2 {
		t.Errorf("tarball config: got %v, %v; want %v", d2, err, d1)
	}
}

// readLayer lists the layer's entries (name, type, mode and owner) and
// copies the files named in extract to the given paths.
func readLayer(t *testing.T, l v1.Layer, extract map[string]string) map[string]tar.Header {
	t.Helper()
	rc, err := l.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	files := map[string]tar.Header{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name] = tar.Header{Typeflag: h.Typeflag, Mode: h.Mode, Uid: h.Uid, Gid: h.Gid}
		if to, ok := extract[h.Name]; ok {
			f, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(f, tr); err != nil {
				t.Fatal(err)
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func TestImageRefusesADynamicBinary(t *testing.T) {
	// The system's own tools link libc dynamically; the image has none.
	dynamic, err := exec.LookPath("true")
	if err != nil {
		t.Skip("no true(1) to stand for a dynamic binary")
	}
	if _, err := checkStatic(dynamic); err == nil || !strings.Contains(err.Error(), "CGO_ENABLED=0") {
		t.Fatalf("checkStatic(%s): got %v, want a refusal naming CGO_ENABLED=0", dynamic, err)
	}
}

func TestTagOf(t *testing.T) {
	for _, tt := range []struct{ version, want string }{
		{"v0.3.0", "v0.3.0"},
		{"(devel)", "dev"},
		{"v0.0.0-20261129230246-a70ba671262d", "v0.0.0-20261129230246-a70ba671262d"},
		{"v1.2.3+dirty", "v1.2.3_dirty"},
	} {
		if got := tagOf(tt.version); got != tt.want {
			t.Errorf("tagOf(%q): got %q, want %q", tt.version, got, tt.want)
		}
	}
}
