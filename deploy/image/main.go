// Command image assembles policyd's container image from a policyd binary
// built first, without a base image and without pulling anything: one
// layer holding /policyd and an empty /data owned by the unprivileged user,
// and a config that runs the daemon as that user with /data as a volume.
//
//	CGO_ENABLED=0 go build -trimpath -o policyd ./cmd/policyd
//	cd deploy && go run ./image --binary ../policyd --layout ../policyd-oci --tarball ../policyd.tar
//	docker load < policyd.tar      # or podman load, or skopeo copy oci:policyd-oci ...
//
// It refuses a binary that is not statically linked: the image has no libc
// and no shell. Labels and the tag come from the binary's own build
// information (its module version and VCS revision).
package main

import (
	"archive/tar"
	"bytes"
	"debug/buildinfo"
	"debug/elf"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The image's fixed facts.
const (
	// UID and GID run the daemon: 65532, the "nonroot" user of distroless
	// images, so volume permissions carry over between the two.
	UID = 65532
	GID = 65532
	// BinaryPath is where the binary lives in the image.
	BinaryPath = "/policyd"
	// DataDir is the volume holding the state file and the admin token.
	DataDir = "/data"
	// GRPCPort and MetricsPort are the ports the default command serves on.
	GRPCPort    = 50051
	MetricsPort = 9464
)

func main() {
	binary := flag.String("binary", "", "the policyd binary to package (built with CGO_ENABLED=0)")
	out := flag.String("layout", "", "write the image as an OCI image layout in this directory")
	tarPath := flag.String("tarball", "", "also write a tarball that docker load and podman load accept")
	repo := flag.String("repository", "policyd", "the repository part of the image's name")
	flag.Parse()
	if err := run(*binary, *out, *tarPath, *repo); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(binary, out, tarPath, repo string) error {
	if binary == "" || (out == "" && tarPath == "") {
		return errors.New("--binary and one of --layout or --tarball are required")
	}
	img, tag, err := build(binary, repo)
	if err != nil {
		return err
	}
	if out != "" {
		p, err := layout.Write(out, empty.Index)
		if err != nil {
			return fmt.Errorf("--layout: %w", err)
		}
		if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{
			"org.opencontainers.image.ref.name": tag.TagStr(),
		})); err != nil {
			return fmt.Errorf("--layout: %w", err)
		}
	}
	if tarPath != "" {
		if err := tarball.WriteToFile(tarPath, tag, img); err != nil {
			return fmt.Errorf("--tarball: %w", err)
		}
	}
	d, err := img.Digest()
	if err != nil {
		return err
	}
	fmt.Printf("%s %s\n", tag.Name(), d)
	return nil
}

// build assembles the image around the binary at path and names it
// repo:<version>.
func build(path, repo string) (v1.Image, name.Tag, error) {
	bin, err := os.ReadFile(path)
	if err != nil {
		return nil, name.Tag{}, fmt.Errorf("--binary: %w", err)
	}
	platform, err := checkStatic(path)
	if err != nil {
		return nil, name.Tag{}, err
	}
	info, err := buildinfo.ReadFile(path)
	if err != nil {
		return nil, name.Tag{}, fmt.Errorf("--binary %s: no Go build information: %w", path, err)
	}
	version, revision, created := describe(info)

	layerTar, err := rootfs(bin, created)
	if err != nil {
		return nil, name.Tag{}, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, name.Tag{}, err
	}
	base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{Layer: layer, History: v1.History{
		Created: v1.Time{Time: created}, CreatedBy: "policyd deploy/image: " + BinaryPath + " and " + DataDir,
	}})
	if err != nil {
		return nil, name.Tag{}, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, name.Tag{}, err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = platform.Architecture, platform.OS
	cf.Created = v1.Time{Time: created}
	cf.Config = v1.Config{
		Entrypoint: []string{BinaryPath},
		Cmd: []string{"serve",
			fmt.Sprintf("--listen=0.0.0.0:%d", GRPCPort),
			"--db=" + DataDir + "/policyd.db",
			fmt.Sprintf("--metrics-listen=0.0.0.0:%d", MetricsPort)},
		User:       fmt.Sprintf("%d:%d", UID, GID),
		WorkingDir: DataDir,
		Volumes:    map[string]struct{}{DataDir: {}},
		ExposedPorts: map[string]struct{}{
			fmt.Sprintf("%d/tcp", GRPCPort):    {},
			fmt.Sprintf("%d/tcp", MetricsPort): {},
		},
		StopSignal: "SIGTERM",
		Labels: map[string]string{
			"org.opencontainers.image.title":    "policyd",
			"org.opencontainers.image.source":   "https://github.com/policyd/policyd",
			"org.opencontainers.image.licenses": "Apache-2.0",
			"org.opencontainers.image.version":  version,
			"org.opencontainers.image.revision": revision,
		},
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, name.Tag{}, err
	}
	tag, err := name.NewTag(repo+":"+tagOf(version), name.WithDefaultRegistry(""))
	if err != nil {
		return nil, name.Tag{}, fmt.Errorf("--repository: %w", err)
	}
	return img, tag, nil
}

// checkStatic refuses an ELF binary that asks for a dynamic loader, and
// reports the platform it was built for.
func checkStatic(path string) (v1.Platform, error) {
	f, err := elf.Open(path)
	if err != nil {
		return v1.Platform{}, fmt.Errorf("--binary %s: not a Linux (ELF) binary: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			return v1.Platform{}, fmt.Errorf("--binary %s: dynamically linked; build it with CGO_ENABLED=0 (the image has no libc)", path)
		}
	}
	arch := map[elf.Machine]string{elf.EM_X86_64: "amd64", elf.EM_AARCH64: "arm64", elf.EM_RISCV: "riscv64", elf.EM_PPC64: "ppc64le", elf.EM_S390: "s390x"}[f.Machine]
	if arch == "" {
		return v1.Platform{}, fmt.Errorf("--binary %s: unsupported machine %s", path, f.Machine)
	}
	return v1.Platform{OS: "linux", Architecture: arch}, nil
}

// describe reads the version, the VCS revision and the commit time of a
// build; the commit time (or the Unix epoch) dates the image, so the same
// binary always makes the same image.
func describe(info *buildinfo.BuildInfo) (version, revision string, created time.Time) {
	version, revision, created = info.Main.Version, "unknown", time.Unix(0, 0).UTC()
	if version == "" {
		version = "(devel)"
	}
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			revision = s.Value
		case "vcs.time":
			if t, err := time.Parse(time.RFC3339, s.Value); err == nil {
				created = t.UTC()
			}
		}
	}
	return version, revision, created
}

// tagOf turns a module version into an image tag: v0.3.0 stays, a pseudo-
// version keeps its characters that tags allow, and a build without a
// version is "dev".
func tagOf(version string) string {
	if version == "(devel)" {
		return "dev"
	}
	t := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '-', r == '_':
			return r
		}
		return '_'
	}, version)
	if len(t) > 128 {
		t = t[:128]
	}
	return t
}

// rootfs is the layer: the binary, executable by everyone and owned by
// root so the daemon cannot rewrite it, and the data directory owned by
// the daemon's user.
func rootfs(bin []byte, mtime time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	entries := []struct {
		hdr  tar.Header
		body []byte
	}{
		{tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(DataDir, "/") + "/", Mode: 0o700, Uid: UID, Gid: GID, ModTime: mtime}, nil},
		{tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(BinaryPath, "/"), Mode: 0o755, Size: int64(len(bin)), ModTime: mtime}, bin},
	}
	for _, e := range entries {
		e.hdr.Format = tar.FormatPAX
		if err := tw.WriteHeader(&e.hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.body); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
