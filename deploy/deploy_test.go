// Package deploy_test checks the deployment assets in this directory as far
// as they can be checked without Docker or a Kubernetes cluster: every YAML
// file parses; the Kubernetes objects and the compose file agree with each
// other, with haproxy.cfg and with quotad's flags; and the Dockerfile's build
// command, run here, produces a static binary that loads the example
// configuration.
package deploy_test

import (
	"bufio"
	"bytes"
	"cmp"
	"debug/elf"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

// repoRoot is the build context of the Dockerfile and compose's build.
const repoRoot = ".."

// readYAML decodes every document of the YAML file at path into a new T.
func readYAML[T any](t *testing.T, path string) []T {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	var docs []T
	for {
		var doc T
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			return docs
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		docs = append(docs, doc)
	}
}

func TestEveryYAMLFileParses(t *testing.T) {
	var files []string
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		// A Helm chart's templates are Go templates of YAML; helm_test.go
		// renders and checks them.
		if err == nil && d.IsDir() && d.Name() == "templates" && filepath.Base(filepath.Dir(filepath.Dir(path))) == "helm" {
			return filepath.SkipDir
		}
		if err == nil && !d.IsDir() && (strings.HasSuffix(path, ".yaml") || strings.HasSuffix(path, ".yml")) {
			files = append(files, path)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 8 {
		t.Fatalf("found %d YAML files (%v); the walk is broken", len(files), files)
	}
	for _, f := range files {
		if docs := readYAML[any](t, f); len(docs) == 0 || slices.Contains(docs, nil) {
			t.Errorf("%s: %d documents, some empty", f, len(docs))
		}
	}
}

// ---- Kubernetes ----

type kustomization struct {
	Resources          []string
	ConfigMapGenerator []struct {
		Name  string
		Files []string
	} `yaml:"configMapGenerator"`
}

type object struct {
	Kind     string
	Metadata struct {
		Name   string
		Labels map[string]string
	}
	Spec yaml.Node
}

type deploymentSpec struct {
	Replicas int
	Selector labelSelector
	Template struct {
		Metadata struct{ Labels map[string]string }
		Spec     struct {
			SecurityContext struct {
				RunAsNonRoot bool `yaml:"runAsNonRoot"`
			} `yaml:"securityContext"`
			Containers []container
			Volumes    []volume
		}
	}
}

type volume struct {
	Name      string
	ConfigMap *struct{ Name string } `yaml:"configMap"`
	Secret    *struct {
		SecretName string `yaml:"secretName"`
	}
}

type labelSelector struct {
	MatchLabels map[string]string `yaml:"matchLabels"`
}

type container struct {
	Image string
	Env   []struct {
		Name, Value string
		ValueFrom   *struct {
			SecretKeyRef *struct{ Name, Key string } `yaml:"secretKeyRef"`
		} `yaml:"valueFrom"`
	}
	Ports []struct {
		Name          string
		ContainerPort int `yaml:"containerPort"`
		Protocol      string
	}
	ReadinessProbe *probe `yaml:"readinessProbe"`
	LivenessProbe  *probe `yaml:"livenessProbe"`
	VolumeMounts   []struct {
		Name      string
		MountPath string `yaml:"mountPath"`
	} `yaml:"volumeMounts"`
}

type probe struct {
	HTTPGet *struct{ Path, Port string } `yaml:"httpGet"`
}

type serviceSpec struct {
	ClusterIP                string `yaml:"clusterIP"`
	PublishNotReadyAddresses bool   `yaml:"publishNotReadyAddresses"`
	Selector                 map[string]string
	Ports                    []struct {
		Name, Protocol string
		TargetPort     string `yaml:"targetPort"`
		Port           int
	}
}

type pdbSpec struct {
	MinAvailable   *int `yaml:"minAvailable"`
	MaxUnavailable *int `yaml:"maxUnavailable"`
	Selector       labelSelector
}

func decodeSpec[T any](t *testing.T, o object) T {
	t.Helper()
	var s T
	if err := o.Spec.Decode(&s); err != nil {
		t.Fatalf("%s %s: spec: %v", o.Kind, o.Metadata.Name, err)
	}
	return s
}

// cluster is what the manifests say, decoded.
type cluster struct {
	kustomization kustomization
	deployment    deploymentSpec
	container     container
	env           map[string]string // plain values; "secret:NAME/KEY" for secret refs
	client        serviceSpec       // the Service clients use
	gossip        serviceSpec       // the headless Service for discovery
	gossipName    string
	pdb           pdbSpec
}

func loadCluster(t *testing.T) cluster {
	t.Helper()
	var c cluster
	c.kustomization = readYAML[kustomization](t, "kustomization.yaml")[0]
	listed := map[string]bool{}
	var objects []object
	for _, r := range c.kustomization.Resources {
		listed[filepath.Clean(r)] = true
		objects = append(objects, readYAML[object](t, r)...)
	}
	// Every manifest is applied: none is left out of the kustomization.
	manifests, _ := filepath.Glob("k8s/*.yaml")
	for _, m := range manifests {
		if !listed[m] {
			t.Errorf("%s is not in kustomization.yaml's resources", m)
		}
	}
	var deployments, headless, clients, pdbs int
	for _, o := range objects {
		switch o.Kind {
		case "Deployment":
			deployments++
			c.deployment = decodeSpec[deploymentSpec](t, o)
		case "Service":
			s := decodeSpec[serviceSpec](t, o)
			if s.ClusterIP == "None" {
				headless++
				c.gossip, c.gossipName = s, o.Metadata.Name
			} else {
				clients++
				c.client = s
			}
		case "PodDisruptionBudget":
			pdbs++
			c.pdb = decodeSpec[pdbSpec](t, o)
		default:
			t.Errorf("unexpected kind %s", o.Kind)
		}
	}
	if deployments != 1 || headless != 1 || clients != 1 || pdbs != 1 {
		t.Fatalf("%d Deployments, %d headless and %d other Services, %d PodDisruptionBudgets; want one of each", deployments, headless, clients, pdbs)
	}
	if n := len(c.deployment.Template.Spec.Containers); n != 1 {
		t.Fatalf("%d containers, want 1", n)
	}
	c.container = c.deployment.Template.Spec.Containers[0]
	c.env = map[string]string{}
	for _, e := range c.container.Env {
		switch {
		case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
			c.env[e.Name] = "secret:" + e.ValueFrom.SecretKeyRef.Name + "/" + e.ValueFrom.SecretKeyRef.Key
		default:
			c.env[e.Name] = e.Value
		}
	}
	return c
}

// containerPort resolves a probe's or Service's port (a number or a port
// name) to a container port number and protocol.
func (c cluster) containerPort(port string) (int, string) {
	for _, p := range c.container.Ports {
		if p.Name == port || strconv.Itoa(p.ContainerPort) == port {
			return p.ContainerPort, cmp.Or(p.Protocol, "TCP")
		}
	}
	return 0, ""
}

// port is the port of a host:port setting.
func port(t *testing.T, name, hostport string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(hostport)
	n, perr := strconv.Atoi(p)
	if err != nil || perr != nil {
		t.Fatalf("%s=%q is not host:port", name, hostport)
	}
	return n
}

func subset(small, big map[string]string) bool {
	for k, v := range small {
		if big[k] != v {
			return false
		}
	}
	return len(small) > 0
}

func TestKubernetesManifests(t *testing.T) {
	c := loadCluster(t)
	labels := c.deployment.Template.Metadata.Labels
	if !subset(c.deployment.Selector.MatchLabels, labels) {
		t.Errorf("Deployment selector %v does not select its pods %v", c.deployment.Selector.MatchLabels, labels)
	}
	if !subset(c.pdb.Selector.MatchLabels, labels) || !subset(c.deployment.Selector.MatchLabels, c.pdb.Selector.MatchLabels) {
		t.Errorf("PodDisruptionBudget selector %v differs from the Deployment's %v", c.pdb.Selector.MatchLabels, c.deployment.Selector.MatchLabels)
	}
	if c.pdb.MaxUnavailable == nil && c.pdb.MinAvailable == nil || c.pdb.MaxUnavailable != nil && *c.pdb.MaxUnavailable >= c.deployment.Replicas {
		t.Errorf("PodDisruptionBudget %+v does not keep a node of %d", c.pdb, c.deployment.Replicas)
	}
	if c.deployment.Replicas < 3 {
		t.Errorf("%d replicas, want at least 3", c.deployment.Replicas)
	}
	if !c.deployment.Template.Spec.SecurityContext.RunAsNonRoot {
		t.Error("pods may run as root")
	}

	// The API: QUOTAD_LISTEN's port is the container's http port, the probes
	// and the client Service reach it.
	listen := port(t, "QUOTAD_LISTEN", c.env["QUOTAD_LISTEN"])
	for name, p := range map[string]*probe{"readiness": c.container.ReadinessProbe, "liveness": c.container.LivenessProbe} {
		if p == nil || p.HTTPGet == nil {
			t.Errorf("no %s probe over HTTP", name)
			continue
		}
		if n, _ := c.containerPort(p.HTTPGet.Port); n != listen || (p.HTTPGet.Path != "/healthz" && p.HTTPGet.Path != "/readyz") {
			t.Errorf("%s probe GET %s on port %s (container port %d), want /healthz or /readyz on %d", name, p.HTTPGet.Path, p.HTTPGet.Port, n, listen)
		}
	}
	if !subset(c.client.Selector, labels) || len(c.client.Ports) != 1 {
		t.Fatalf("client Service selects %v with ports %+v", c.client.Selector, c.client.Ports)
	}
	if n, _ := c.containerPort(c.client.Ports[0].TargetPort); n != listen {
		t.Errorf("client Service targets container port %d, quotad listens on %d", n, listen)
	}

	// Gossip: TCP and UDP on QUOTAD_CLUSTER_ADDR's port, in the container
	// and the headless Service, which QUOTAD_JOIN names.
	gossip := port(t, "QUOTAD_CLUSTER_ADDR", c.env["QUOTAD_CLUSTER_ADDR"])
	if port(t, "QUOTAD_CLUSTER_ADVERTISE", c.env["QUOTAD_CLUSTER_ADVERTISE"]) != gossip {
		t.Error("QUOTAD_CLUSTER_ADVERTISE's port is not QUOTAD_CLUSTER_ADDR's")
	}
	if !c.gossip.PublishNotReadyAddresses || !subset(c.gossip.Selector, labels) {
		t.Errorf("headless Service %s: publishNotReadyAddresses %t, selector %v", c.gossipName, c.gossip.PublishNotReadyAddresses, c.gossip.Selector)
	}
	protocols := map[string]bool{}
	for _, p := range c.gossip.Ports {
		n, proto := c.containerPort(p.TargetPort)
		if n != gossip || p.Port != gossip || proto != cmp.Or(p.Protocol, "TCP") {
			t.Errorf("headless Service port %+v: container port %d/%s, want %d", p, n, proto, gossip)
		}
		protocols[proto] = true
	}
	if !protocols["TCP"] || !protocols["UDP"] {
		t.Errorf("gossip port offers %v, memberlist needs TCP and UDP", protocols)
	}
	join := c.env["QUOTAD_JOIN"]
	if host, _, _ := net.SplitHostPort(join); host != c.gossipName || port(t, "QUOTAD_JOIN", join) != gossip {
		t.Errorf("QUOTAD_JOIN=%q, want %s:%d", join, c.gossipName, gossip)
	}

	// Redis from a Secret (the URL may hold a password); the config file
	// and the cluster key from volumes mounted where the settings point.
	if !strings.HasPrefix(c.env["QUOTAD_REDIS"], "secret:") {
		t.Errorf("QUOTAD_REDIS=%q, want it from a Secret", c.env["QUOTAD_REDIS"])
	}
	gen := c.kustomization.ConfigMapGenerator
	if len(gen) != 1 || len(gen[0].Files) != 1 {
		t.Fatalf("configMapGenerator %+v, want one ConfigMap of one file", gen)
	}
	mounted := func(setting, file string, fromVolume func(name string) bool) {
		dir, base := filepath.Split(c.env[setting])
		for _, m := range c.container.VolumeMounts {
			if filepath.Clean(m.MountPath) == filepath.Clean(dir) && fromVolume(m.Name) && (file == "" || base == file) {
				return
			}
		}
		t.Errorf("%s=%q is not a file of the volume it should come from", setting, c.env[setting])
	}
	volumes := c.deployment.Template.Spec.Volumes
	mounted("QUOTAD_CONFIG", filepath.Base(gen[0].Files[0]), func(name string) bool {
		return slices.ContainsFunc(volumes, func(v volume) bool {
			return v.Name == name && v.ConfigMap != nil && v.ConfigMap.Name == gen[0].Name
		})
	})
	mounted("QUOTAD_CLUSTER_KEY_FILE", "", func(name string) bool {
		return slices.ContainsFunc(volumes, func(v volume) bool { return v.Name == name && v.Secret != nil })
	})
}

// ---- compose and HAProxy ----

type composeFile struct {
	Services map[string]struct {
		Build *struct {
			Context, Dockerfile string
		}
		Environment map[string]string
		Volumes     []string
		Ports       []string
	}
}

type haproxyConfig struct {
	bindPort int
	servers  map[string]int // host → port
	h2, hc   bool           // servers speak h2c; health check on /readyz
	// grpcApart: gRPC requests go to a backend of their own (quotad serves
	// a gRPC-first connection with grpc-go, which answers nothing else).
	grpcApart bool
}

func readHAProxy(t *testing.T, path string) haproxyConfig {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	h := haproxyConfig{servers: map[string]int{}}
	for line := range strings.Lines(string(raw)) {
		f := strings.Fields(line)
		switch {
		case len(f) == 0 || strings.HasPrefix(f[0], "#"):
		case f[0] == "bind":
			h.bindPort = port(t, "bind", f[1])
		case f[0] == "server" && len(f) >= 3:
			host, _, _ := net.SplitHostPort(f[2])
			h.servers[host] = port(t, "server "+f[1], f[2])
		case f[0] == "default-server":
			h.h2 = strings.Contains(line, "proto h2")
		case f[0] == "option" && f[1] == "httpchk":
			h.hc = slices.Contains(f, "/readyz")
		case f[0] == "acl" && strings.Contains(line, "req.hdr(content-type)") && strings.Contains(line, "application/grpc"):
			h.grpcApart = true
		}
	}
	return h
}

func TestComposeFile(t *testing.T) {
	c := readYAML[composeFile](t, "compose.yaml")[0]
	var nodes []string
	for name := range c.Services {
		if strings.HasPrefix(name, "quotad-") {
			nodes = append(nodes, name)
		}
	}
	slices.Sort(nodes)
	if len(nodes) < 3 {
		t.Fatalf("quotad services %v, want three", nodes)
	}
	if _, ok := c.Services["redis"]; !ok {
		t.Fatal("no redis service")
	}
	lb, ok := c.Services["lb"]
	if !ok || !slices.Contains(lb.Ports, "8080:8080") {
		t.Fatalf("lb publishes %v, want 8080:8080", lb.Ports)
	}
	hp := readHAProxy(t, "haproxy.cfg")
	if !slices.ContainsFunc(lb.Volumes, func(v string) bool { return strings.HasPrefix(v, "./haproxy.cfg:") }) || hp.bindPort != 8080 {
		t.Errorf("lb mounts %v, HAProxy binds %d; want ./haproxy.cfg and 8080", lb.Volumes, hp.bindPort)
	}
	if !hp.h2 || !hp.hc || !hp.grpcApart {
		t.Errorf("HAProxy servers: proto h2 %t, /readyz checks %t, gRPC on a backend of its own %t; want all three", hp.h2, hp.hc, hp.grpcApart)
	}
	names := map[string]bool{}
	for _, n := range nodes {
		s := c.Services[n]
		env := s.Environment
		if s.Build == nil || s.Build.Dockerfile != "deploy/Dockerfile" || filepath.Clean(s.Build.Context) != repoRoot {
			t.Errorf("%s builds %+v, want deploy/Dockerfile in the repository root", n, s.Build)
		}
		if env["QUOTAD_REDIS"] != "redis://redis:6379/0" {
			t.Errorf("%s: QUOTAD_REDIS=%q, want the redis service", n, env["QUOTAD_REDIS"])
		}
		if p, ok := hp.servers[n]; !ok || p != port(t, "QUOTAD_LISTEN", env["QUOTAD_LISTEN"]) {
			t.Errorf("%s listens on %q, HAProxy sends to port %d", n, env["QUOTAD_LISTEN"], p)
		}
		gossip := port(t, "QUOTAD_CLUSTER_ADDR", env["QUOTAD_CLUSTER_ADDR"])
		var seeds []string
		for _, seed := range strings.Split(env["QUOTAD_JOIN"], ",") {
			host, _, _ := net.SplitHostPort(seed)
			if port(t, "QUOTAD_JOIN", seed) != gossip {
				t.Errorf("%s: seed %s is not on the gossip port %d", n, seed, gossip)
			}
			seeds = append(seeds, host)
		}
		slices.Sort(seeds)
		if !slices.Equal(seeds, nodes) {
			t.Errorf("%s joins %v, want %v", n, seeds, nodes)
		}
		if names[env["QUOTAD_NODE_NAME"]] || env["QUOTAD_NODE_NAME"] == "" {
			t.Errorf("%s: node name %q empty or taken", n, env["QUOTAD_NODE_NAME"])
		}
		names[env["QUOTAD_NODE_NAME"]] = true
		// quotad refuses to gossip without a key: the nodes
		// share one, from a volume.
		keyDir := filepath.Dir(env["QUOTAD_CLUSTER_KEY_FILE"])
		if env["QUOTAD_CLUSTER_KEY_FILE"] == "" || !slices.ContainsFunc(s.Volumes, func(v string) bool {
			f := strings.Split(v, ":")
			return len(f) >= 2 && filepath.Clean(f[1]) == keyDir
		}) {
			t.Errorf("%s: QUOTAD_CLUSTER_KEY_FILE=%q is not in a volume it mounts (%v)", n, env["QUOTAD_CLUSTER_KEY_FILE"], s.Volumes)
		}
		if !slices.ContainsFunc(s.Volumes, func(v string) bool {
			src, dst, _ := strings.Cut(v, ":")
			_, err := os.Stat(src)
			return err == nil && strings.HasPrefix(dst, env["QUOTAD_CONFIG"]+":")
		}) {
			t.Errorf("%s: QUOTAD_CONFIG=%q is not mounted from a file here (%v)", n, env["QUOTAD_CONFIG"], s.Volumes)
		}
	}
	if len(hp.servers) != len(nodes) {
		t.Errorf("HAProxy balances %v, compose runs %v", hp.servers, nodes)
	}
}

// ---- the Dockerfile and the binary it builds ----

type instruction struct {
	op, args string
}

// readDockerfile returns the instructions, continuation lines joined and
// comments dropped.
func readDockerfile(t *testing.T) []instruction {
	t.Helper()
	raw, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var out []instruction
	var cur strings.Builder
	for line := range strings.Lines(string(raw)) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if l, ok := strings.CutSuffix(line, `\`); ok {
			cur.WriteString(l + " ")
			continue
		}
		cur.WriteString(line)
		op, args, _ := strings.Cut(cur.String(), " ")
		out = append(out, instruction{strings.ToUpper(op), strings.TrimSpace(args)})
		cur.Reset()
	}
	return out
}

// buildBinary runs the Dockerfile's `go build` command in the repository
// root with its -o pointing into a temporary directory, and checks what
// else the Dockerfile says about the binary. It returns the binary's path.
func buildBinary(t *testing.T) string {
	t.Helper()
	var (
		goVersion, buildCmd, copied, entrypoint, user string
		stages                                        []string
		exposed                                       []string
	)
	for _, in := range readDockerfile(t) {
		switch in.op {
		case "ARG":
			if v, ok := strings.CutPrefix(in.args, "GO_VERSION="); ok {
				goVersion = v
			}
		case "FROM":
			stages = append(stages, in.args)
			user = ""
		case "RUN":
			if strings.Contains(in.args, "go build") {
				buildCmd = in.args
			}
		case "COPY":
			if f := strings.Fields(in.args); len(f) == 3 && f[0] == "--from=build" {
				copied = f[1] + " " + f[2]
			}
		case "ENTRYPOINT":
			var argv []string
			if err := json.Unmarshal([]byte(in.args), &argv); err != nil || len(argv) == 0 {
				t.Fatalf("ENTRYPOINT %s is not an exec-form JSON array", in.args)
			}
			entrypoint = argv[0]
		case "USER":
			user = in.args
		case "EXPOSE":
			exposed = strings.Fields(in.args)
		}
	}
	gomod, err := os.ReadFile(filepath.Join(repoRoot, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	if m := regexp.MustCompile(`(?m)^go (\S+)$`).FindSubmatch(gomod); m == nil || string(m[1]) != goVersion {
		t.Errorf("Dockerfile's GO_VERSION %q differs from go.mod's go directive", goVersion)
	}
	if len(stages) != 2 || !strings.HasSuffix(stages[0], " AS build") || !strings.Contains(stages[1], "distroless/static") {
		t.Errorf("stages %q, want a build stage and a distroless/static final stage", stages)
	}
	if user == "" || strings.HasPrefix(user, "root") || strings.HasPrefix(user, "0") {
		t.Errorf("final stage runs as %q, want a non-root user", user)
	}
	for _, p := range []string{"8080/tcp", "7946/tcp", "7946/udp"} {
		if !slices.Contains(exposed, p) {
			t.Errorf("EXPOSE %v lacks %s", exposed, p)
		}
	}
	out := regexp.MustCompile(`-o\s+(\S+)`).FindStringSubmatch(buildCmd)
	if !strings.HasPrefix(buildCmd, "CGO_ENABLED=0 ") || out == nil {
		t.Fatalf("build command %q: want CGO_ENABLED=0 go build ... -o PATH", buildCmd)
	}
	if copied != out[1]+" "+entrypoint {
		t.Errorf("the final stage copies %q and runs %q; the build writes %s", copied, entrypoint, out[1])
	}
	bin := filepath.Join(t.TempDir(), "quotad")
	cmd := exec.Command("sh", "-c", strings.Replace(buildCmd, out[0], "-o "+bin, 1))
	cmd.Dir = repoRoot
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", cmd, err, msg)
	}
	return bin
}

// The Dockerfile's build yields a static binary (no interpreter, no shared
// libraries: it runs on distroless/static), which knows every flag the
// deployments set and loads the example configuration.
func TestDockerfileBuildsAStaticBinary(t *testing.T) {
	bin := buildBinary(t)
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("the binary has an ELF interpreter: it is dynamically linked")
		}
	}
	if libs, err := f.ImportedLibraries(); err != nil || len(libs) > 0 {
		t.Errorf("the binary needs shared libraries %v (%v)", libs, err)
	}

	t.Run("knows the deployments' settings", func(t *testing.T) { checkSettings(t, bin) })
	t.Run("loads the example configuration", func(t *testing.T) { checkExampleConfig(t, bin) })
	t.Run("has the check subcommand", func(t *testing.T) {
		if out, err := exec.Command(bin, "check", "--help").CombinedOutput(); err != nil || !strings.Contains(string(out), "Exit status") {
			t.Fatalf("quotad check --help: %v\n%s", err, out)
		}
	})
}

// clusterSettings are the cluster flags the deployments use.
var clusterSettings = []string{"cluster-addr", "cluster-advertise", "join", "node-name", "cluster-key-file"}

// checkSettings requires every QUOTAD_* variable the deployments set to be
// one of quotad's flags (QUOTAD_ + the flag upper-cased, '-' as '_'). Until
// this quotad has clustering (no --cluster-addr in its help), the cluster
// settings are the one exception; once it has, they are checked like the
// rest.
func checkSettings(t *testing.T, bin string) {
	help, _ := exec.Command(bin, "--help").CombinedOutput() // --help exits 0; the text is what matters
	has := func(flag string) bool {
		return regexp.MustCompile(`(?m)^\s+-` + regexp.QuoteMeta(flag) + `\b`).Match(help)
	}
	if !has("listen") {
		t.Fatalf("quotad --help lists no -listen:\n%s", help)
	}
	clustered := has("cluster-addr")
	used := map[string]bool{}
	for _, s := range readYAML[composeFile](t, "compose.yaml")[0].Services {
		for k := range s.Environment {
			used[k] = true
		}
	}
	for k := range loadCluster(t).env {
		used[k] = true
	}
	for env := range used {
		name, ok := strings.CutPrefix(env, "QUOTAD_")
		if !ok {
			continue
		}
		flag := strings.ToLower(strings.ReplaceAll(name, "_", "-"))
		switch {
		case has(flag):
		case !clustered && slices.Contains(clusterSettings, flag):
			t.Logf("%s: --%s is not in this quotad yet (clustering lands separately)", env, flag)
		default:
			t.Errorf("the deployments set %s, but quotad has no --%s", env, flag)
		}
	}
}

// checkExampleConfig starts the binary on the example configuration (with
// the memory store: no Redis here), waits until it listens (so it has
// loaded the file) and stops it.
func checkExampleConfig(t *testing.T, bin string) {
	cmd := exec.Command(bin, "--config", "quotad.yaml", "--listen", "127.0.0.1:0")
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")} // no QUOTAD_* from the test's environment
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	first := make(chan string, 1)
	go func() {
		lines := bufio.NewScanner(stdout)
		lines.Scan()
		first <- lines.Text()
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case line := <-first:
		if !strings.HasPrefix(line, "quotad listening on ") {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatalf("quotad --config quotad.yaml printed %q\n%s", line, stderr.String())
		}
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("quotad --config quotad.yaml did not listen within 30s\n%s", stderr.String())
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("quotad exited with %v after SIGTERM\n%s", err, stderr.String())
	}
}
