package deploy

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// manifest is one decoded document of a manifest file: its kind, its
// name and the API object.
type manifest struct {
	kind, name string
	obj        any
}

// decode splits a multi-document YAML file and decodes each document
// strictly (unknown or duplicate fields are errors) into the API type its
// apiVersion and kind name.
func decode(path string, raw []byte) ([]manifest, error) {
	var out []manifest
	for i, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(raw), -1) {
		if strings.TrimSpace(regexp.MustCompile(`(?m)^\s*#.*$`).ReplaceAllString(doc, "")) == "" {
			continue
		}
		var head struct {
			metav1.TypeMeta `json:",inline"`
			Metadata        struct{ Name string } `json:"metadata"`
		}
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", path, i, err)
		}
		tm := head.TypeMeta
		var obj any
		switch tm.APIVersion + "/" + tm.Kind {
		case "v1/ConfigMap":
			obj = &corev1.ConfigMap{}
		case "v1/Service":
			obj = &corev1.Service{}
		case "v1/Secret":
			obj = &corev1.Secret{}
		case "apps/v1/StatefulSet":
			obj = &appsv1.StatefulSet{}
		case "apps/v1/Deployment":
			obj = &appsv1.Deployment{}
		case "policy/v1/PodDisruptionBudget":
			obj = &policyv1.PodDisruptionBudget{}
		default:
			return nil, fmt.Errorf("%s: document %d: unexpected %s %s", path, i, tm.APIVersion, tm.Kind)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			return nil, fmt.Errorf("%s: document %d (%s): %w", path, i, tm.Kind, err)
		}
		out = append(out, manifest{kind: tm.Kind, name: head.Metadata.Name, obj: obj})
	}
	return out, nil
}

func TestDecodeRefusesUnknownFields(t *testing.T) {
	for name, doc := range map[string]string{
		"misspelt field":  "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {selektor: {a: b}}\n",
		"duplicate field": "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {type: ClusterIP, type: NodePort}\n",
		"wrong type":      "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {replicas: three}\n",
		"unknown kind":    "apiVersion: v1\nkind: Servise\nmetadata: {name: x}\n",
	} {
		if _, err := decode(name, []byte(doc)); err == nil {
			t.Errorf("%s: decoded without an error", name)
		}
	}
}

// serveFlags are the flags `policyd serve` accepts, read from its --help.
var serveFlags = sync.OnceValues(func() (map[string]bool, error) {
	cmd := exec.Command("go", "run", "./cmd/policyd", "serve", "--help")
	cmd.Dir = ".."
	out, err := cmd.CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("policyd serve --help: %v\n%s", err, out)
	}
	flags := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s+(?:-\w, )?--([a-z0-9-]+)`).FindAllStringSubmatch(string(out), -1) {
		flags[m[1]] = true
	}
	return flags, nil
})

// pendingFlags are flags the manifests use for engines not built yet.
var pendingFlags = map[string]string{"store": "the Redis engine"}

// checkArgs fails for a --flag in args that policyd serve does not know.
func checkArgs(t *testing.T, where string, args []string) {
	t.Helper()
	flags, err := serveFlags()
	if err != nil {
		t.Fatal(err)
	}
	if len(args) == 0 || args[0] != "serve" {
		t.Errorf("%s: args %q do not start with serve", where, args)
	}
	for _, a := range args[1:] {
		name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !strings.HasPrefix(a, "--") {
			t.Errorf("%s: argument %q is not a --flag=value", where, a)
		} else if pending, ok := pendingFlags[name]; ok {
			t.Logf("%s: --%s waits for %s", where, name, pending)
		} else if !flags[name] {
			t.Errorf("%s: policyd serve has no flag --%s", where, name)
		}
	}
}

// checkPod checks what both profiles' pods need: not root, native gRPC
// probes on the gRPC port, a read-only root, known flags.
func checkPod(t *testing.T, where string, pod corev1.PodTemplateSpec, selector *metav1.LabelSelector) {
	t.Helper()
	sel, err := metav1.LabelSelectorAsSelector(selector)
	if err != nil {
		t.Fatalf("%s: selector: %v", where, err)
	}
	if !sel.Matches(labels.Set(pod.Labels)) {
		t.Errorf("%s: selector %s does not match the pod labels %v", where, sel, pod.Labels)
	}
	sc := pod.Spec.SecurityContext
	if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser == 0 {
		t.Errorf("%s: the pod must run as a non-root user", where)
	}
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("%s: %d containers, want 1", where, len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]
	checkArgs(t, where, c.Args)
	var grpcPort int32
	for _, p := range c.Ports {
		if p.Name == "grpc" {
			grpcPort = p.ContainerPort
		}
	}
	if !slices.Contains(c.Args, fmt.Sprintf("--listen=0.0.0.0:%d", grpcPort)) {
		t.Errorf("%s: the grpc port %d is not what --listen serves on: %q", where, grpcPort, c.Args)
	}
	for name, p := range map[string]*corev1.Probe{"startup": c.StartupProbe, "readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		if p == nil || p.GRPC == nil || p.GRPC.Port != grpcPort {
			t.Errorf("%s: the %s probe must be a native gRPC probe on port %d", where, name, grpcPort)
		}
	}
	if c.SecurityContext == nil || c.SecurityContext.ReadOnlyRootFilesystem == nil || !*c.SecurityContext.ReadOnlyRootFilesystem ||
		c.SecurityContext.AllowPrivilegeEscalation == nil || *c.SecurityContext.AllowPrivilegeEscalation {
		t.Errorf("%s: the container must have a read-only root and no privilege escalation", where)
	}
}

// checkService fails unless svc selects the pod and names its ports.
func checkService(t *testing.T, svc *corev1.Service, pod corev1.PodTemplateSpec) {
	t.Helper()
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(pod.Labels)) {
		t.Errorf("Service %s: selector %v does not match the pod labels %v", svc.Name, svc.Spec.Selector, pod.Labels)
	}
	for _, p := range svc.Spec.Ports {
		if !slices.ContainsFunc(pod.Spec.Containers[0].Ports, func(cp corev1.ContainerPort) bool { return cp.Name == p.TargetPort.String() }) {
			t.Errorf("Service %s: target port %s is not a container port", svc.Name, p.TargetPort.String())
		}
	}
}

// load decodes a manifest file into its objects by "Kind/name".
func load(t *testing.T, path string) map[string]any {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ms, err := decode(path, raw)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]any{}
	for _, m := range ms {
		key := m.kind + "/" + m.name
		if _, dup := byName[key]; dup {
			t.Fatalf("%s: two %s", path, key)
		}
		byName[key] = m.obj
	}
	return byName
}

func TestBboltProfile(t *testing.T) {
	objs := load(t, filepath.Join("kubernetes", "bbolt", "policyd.yaml"))
	sts, ok := objs["StatefulSet/policyd"].(*appsv1.StatefulSet)
	if !ok {
		t.Fatalf("no StatefulSet in %v", objs)
	}
	if sts.Spec.Replicas == nil || *sts.Spec.Replicas != 1 {
		t.Errorf("StatefulSet: replicas must be exactly 1 (one writer per bbolt file)")
	}
	checkPod(t, "StatefulSet", sts.Spec.Template, sts.Spec.Selector)
	if len(sts.Spec.VolumeClaimTemplates) != 1 {
		t.Fatalf("StatefulSet: %d volume claim templates, want 1", len(sts.Spec.VolumeClaimTemplates))
	}
	claim := sts.Spec.VolumeClaimTemplates[0].Name
	c := sts.Spec.Template.Spec.Containers[0]
	if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == claim && m.MountPath == "/data" }) {
		t.Errorf("StatefulSet: the claim %q is not mounted on /data", claim)
	}
	if !slices.Contains(c.Args, "--db=/data/policyd.db") {
		t.Errorf("StatefulSet: the state file is not on the volume: %q", c.Args)
	}
	pdb, ok := objs["PodDisruptionBudget/policyd"].(*policyv1.PodDisruptionBudget)
	if !ok {
		t.Fatal("no PodDisruptionBudget")
	}
	sel, _ := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
	if !sel.Matches(labels.Set(sts.Spec.Template.Labels)) {
		t.Errorf("PodDisruptionBudget: selector %s does not cover the pod", sel)
	}
	svc, ok := objs["Service/policyd"].(*corev1.Service)
	if !ok {
		t.Fatal("no Service policyd")
	}
	checkService(t, svc, sts.Spec.Template)
	if _, ok := objs["ConfigMap/policyd-policy"]; !ok {
		t.Error("no ConfigMap with the policy file")
	}
}

func TestRedisProfile(t *testing.T) {
	objs := load(t, filepath.Join("kubernetes", "redis", "policyd.yaml"))
	dep, ok := objs["Deployment/policyd"].(*appsv1.Deployment)
	if !ok {
		t.Fatalf("no Deployment in %v", objs)
	}
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas < 2 {
		t.Errorf("Deployment: the Redis profile is for several replicas")
	}
	checkPod(t, "Deployment", dep.Spec.Template, dep.Spec.Selector)
	svc, ok := objs["Service/policyd-headless"].(*corev1.Service)
	if !ok {
		t.Fatal("no Service policyd-headless")
	}
	if svc.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("Service policyd-headless: clusterIP %q, want None (clients balance over the replicas)", svc.Spec.ClusterIP)
	}
	checkService(t, svc, dep.Spec.Template)
	if _, ok := objs["PodDisruptionBudget/policyd"]; !ok {
		t.Error("no PodDisruptionBudget")
	}
}

// TestSystemdUnit checks deploy/systemd/policyd.service with
// systemd-analyze: verify (syntax, every key known, ExecStart
// executable) and security (the exposure score stays low).
func TestSystemdUnit(t *testing.T) {
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Skip("systemd-analyze is not installed: deploy/systemd/policyd.service not verified")
	}
	raw, err := os.ReadFile(filepath.Join("systemd", "policyd.service"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"StateDirectory=policyd", "DynamicUser=yes", "NoNewPrivileges=yes",
		"ProtectSystem=strict", "ExecReload=/bin/kill -HUP $MAINPID"} {
		if !bytes.Contains(raw, []byte("\n"+want+"\n")) {
			t.Errorf("the unit lacks %s", want)
		}
	}
	// verify wants ExecStart's binary to exist: point it at this test's
	// own executable in a copy of the unit.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	unit := filepath.Join(t.TempDir(), "policyd.service")
	if !bytes.Contains(raw, []byte("ExecStart=/usr/local/bin/policyd ")) {
		t.Fatal("ExecStart does not run /usr/local/bin/policyd")
	}
	if err := os.WriteFile(unit, bytes.Replace(raw, []byte("ExecStart=/usr/local/bin/policyd "), []byte("ExecStart="+self+" "), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	// verify exits 0 on unknown keys and bad values too; it only prints
	// them, so any output is a failure.
	out, err := exec.Command("systemd-analyze", "verify", unit).CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
	out, err = exec.Command("systemd-analyze", "security", "--offline=yes", "--threshold=20", "--no-pager", unit).CombinedOutput()
	if err != nil {
		t.Errorf("systemd-analyze security: exposure above 2.0 (%v)\n%s", err, out)
	} else if i := bytes.Index(out, []byte("Overall exposure level")); i >= 0 {
		t.Logf("%s", bytes.TrimSpace(out[i:]))
	}
}
