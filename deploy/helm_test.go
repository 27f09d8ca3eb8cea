package deploy_test

// The Helm chart in helm/quotad, rendered by the real helm CLI and checked
// offline: every object decodes strictly (unknown or misspelt fields,
// duplicate fields and unknown kinds are errors) into the Kubernetes API's
// own Go types (k8s.io/api, and the Prometheus Operator's for the
// ServiceMonitor), its names, labels and ports pass apimachinery's
// validation, the default rendering matches the kustomize manifests, and
// every QUOTAD_* variable it sets is a flag of quotad.

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"gopkg.in/yaml.v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/validation"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/quotad/quotad/internal/quotadtest"
)

const chartDir = "helm/quotad"

// helmVersion is the helm the Makefile installs (HELM_VERSION).
const helmVersion = "v3.22.0"

// helmBinary finds helm: $HELM (make test sets it), the Makefile's
// .tools/helm-<version>/helm, or helm on the PATH. Its absence fails the
// test with the way to install it.
func helmBinary(t *testing.T) string {
	t.Helper()
	if h := os.Getenv("HELM"); h != "" {
		if _, err := os.Stat(h); err == nil {
			return h
		}
	}
	if p, err := filepath.Abs(filepath.Join(repoRoot, ".tools", "helm-"+helmVersion, "helm")); err == nil {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath("helm"); err == nil {
		return p
	}
	t.Fatalf("helm not found: run `make helm` (go install helm.sh/helm/v3/cmd/helm@%s into .tools/helm-%s), or set HELM", helmVersion, helmVersion)
	return ""
}

// helm runs the helm CLI with its caches in a temporary directory.
func helm(t *testing.T, args ...string) ([]byte, error) {
	t.Helper()
	cmd := exec.Command(helmBinary(t), args...)
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home, "HELM_CONFIG_HOME="+home, "HELM_DATA_HOME="+home)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("helm %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return out, nil
}

// render is `helm template quotad helm/quotad` with values (a YAML file's
// content, may be empty) and extra arguments.
func render(t *testing.T, values string, args ...string) ([]byte, error) {
	t.Helper()
	full := []string{"template", "quotad", chartDir, "--namespace", "quotad"}
	if values != "" {
		full = append(full, "--values", writeTemp(t, "values.yaml", values))
	}
	return helm(t, append(full, args...)...)
}

func writeTemp(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// objects are decoded Kubernetes objects by kind.
type objects struct {
	deployments     []*appsv1.Deployment
	services        []*corev1.Service
	pdbs            []*policyv1.PodDisruptionBudget
	configMaps      []*corev1.ConfigMap
	secrets         []*corev1.Secret
	serviceMonitors []*monitoringv1.ServiceMonitor
	networkPolicies []*networkingv1.NetworkPolicy
}

func (o objects) kinds() []string {
	var k []string
	add := func(kind string, n int) {
		for range n {
			k = append(k, kind)
		}
	}
	add("ConfigMap", len(o.configMaps))
	add("Deployment", len(o.deployments))
	add("NetworkPolicy", len(o.networkPolicies))
	add("PodDisruptionBudget", len(o.pdbs))
	add("Secret", len(o.secrets))
	add("Service", len(o.services))
	add("ServiceMonitor", len(o.serviceMonitors))
	return k
}

func (o objects) service(t *testing.T, headless bool) *corev1.Service {
	t.Helper()
	for _, s := range o.services {
		if (s.Spec.ClusterIP == corev1.ClusterIPNone) == headless {
			return s
		}
	}
	t.Fatalf("no Service with headless=%t", headless)
	return nil
}

// decodeStrict decodes every document of a multi-document YAML stream
// into the API's typed objects. The decoder is apimachinery's, in strict
// mode: an unknown or duplicate field, a kind or apiVersion the scheme
// does not know, or a value of the wrong type is an error.
func decodeStrict(t *testing.T, name string, manifest []byte) objects {
	t.Helper()
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{appsv1.AddToScheme, corev1.AddToScheme, policyv1.AddToScheme, monitoringv1.AddToScheme, networkingv1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	dec := serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()
	var o objects
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(manifest)))
	for i := 0; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: document %d: %v", name, i, err)
		}
		if j, err := utilyaml.ToJSON(doc); err != nil || string(j) == "null" {
			continue // only comments
		}
		obj, gvk, err := dec.Decode(doc, nil, nil)
		if err != nil {
			t.Errorf("%s: document %d (%v): %v", name, i, gvk, err)
			continue
		}
		switch v := obj.(type) {
		case *appsv1.Deployment:
			o.deployments = append(o.deployments, v)
		case *corev1.Service:
			o.services = append(o.services, v)
		case *policyv1.PodDisruptionBudget:
			o.pdbs = append(o.pdbs, v)
		case *corev1.ConfigMap:
			o.configMaps = append(o.configMaps, v)
		case *corev1.Secret:
			o.secrets = append(o.secrets, v)
		case *monitoringv1.ServiceMonitor:
			o.serviceMonitors = append(o.serviceMonitors, v)
		case *networkingv1.NetworkPolicy:
			o.networkPolicies = append(o.networkPolicies, v)
		default:
			t.Errorf("%s: document %d: unexpected %T", name, i, obj)
		}
	}
	validate(t, name, o)
	return o
}

// validate applies the API server's rules for names, labels, ports and
// variable names that no schema expresses, and the references between the
// objects: selectors select the pods, Services target named ports, volumes
// and mounts match.
func validate(t *testing.T, name string, o objects) {
	t.Helper()
	errs := func(what string, msgs []string) {
		for _, m := range msgs {
			t.Errorf("%s: %s: %s", name, what, m)
		}
	}
	labels := func(kind, obj string, l map[string]string) {
		for k, v := range l {
			errs(kind+" "+obj+" label key "+k, validation.IsQualifiedName(k))
			errs(kind+" "+obj+" label value "+v, validation.IsValidLabelValue(v))
		}
	}
	for _, s := range o.services {
		errs("Service name "+s.Name, validation.IsDNS1035Label(s.Name))
		labels("Service", s.Name, s.Labels)
		for _, p := range s.Spec.Ports {
			errs("Service port name "+p.Name, validation.IsValidPortName(p.Name))
		}
	}
	for _, c := range o.configMaps {
		errs("ConfigMap name "+c.Name, validation.IsDNS1123Subdomain(c.Name))
		for k := range c.Data {
			errs("ConfigMap key "+k, validation.IsConfigMapKey(k))
		}
	}
	for _, s := range o.secrets {
		errs("Secret name "+s.Name, validation.IsDNS1123Subdomain(s.Name))
	}
	for _, d := range o.deployments {
		errs("Deployment name "+d.Name, validation.IsDNS1123Subdomain(d.Name))
		labels("Deployment", d.Name, d.Labels)
		pod := d.Spec.Template
		labels("pod template", d.Name, pod.Labels)
		if d.Spec.Selector == nil || !subset(d.Spec.Selector.MatchLabels, pod.Labels) {
			t.Errorf("%s: Deployment %s's selector %v does not select its pods %v", name, d.Name, d.Spec.Selector, pod.Labels)
		}
		volumes := map[string]corev1.Volume{}
		for _, v := range pod.Spec.Volumes {
			errs("volume name "+v.Name, validation.IsDNS1123Label(v.Name))
			volumes[v.Name] = v
		}
		for _, c := range pod.Spec.Containers {
			if c.Image == "" || c.Name == "" {
				t.Errorf("%s: container %q has no name or image %q", name, c.Name, c.Image)
			}
			for _, p := range c.Ports {
				errs("container port name "+p.Name, validation.IsValidPortName(p.Name))
				errs("container port", validation.IsValidPortNum(int(p.ContainerPort)))
			}
			for _, e := range c.Env {
				errs("env name "+e.Name, validation.IsEnvVarName(e.Name))
			}
			for _, m := range c.VolumeMounts {
				if _, ok := volumes[m.Name]; !ok {
					t.Errorf("%s: mount %s names no volume", name, m.Name)
				}
			}
		}
		for _, s := range o.services {
			if !subset(s.Spec.Selector, pod.Labels) {
				t.Errorf("%s: Service %s selects %v, not the pods %v", name, s.Name, s.Spec.Selector, pod.Labels)
			}
		}
		for _, p := range o.pdbs {
			if p.Spec.Selector == nil || !subset(p.Spec.Selector.MatchLabels, pod.Labels) {
				t.Errorf("%s: PodDisruptionBudget %s does not select the pods", name, p.Name)
			}
		}
	}
}

// container is the one quotad container of the one Deployment.
func (o objects) container(t *testing.T) corev1.Container {
	t.Helper()
	if len(o.deployments) != 1 || len(o.deployments[0].Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("%d Deployments; want one with one container", len(o.deployments))
	}
	return o.deployments[0].Spec.Template.Spec.Containers[0]
}

// envValue is a variable's value, or "secret:NAME/KEY" for a secret
// reference.
func envValue(c corev1.Container, name string) (string, bool) {
	for _, e := range c.Env {
		if e.Name != name {
			continue
		}
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			return "secret:" + e.ValueFrom.SecretKeyRef.Name + "/" + e.ValueFrom.SecretKeyRef.Key, true
		}
		return e.Value, true
	}
	return "", false
}

// fileFromVolume reports which volume holds the file at path in c, and
// under which key of its Secret or ConfigMap.
func fileFromVolume(pod corev1.PodSpec, c corev1.Container, path string) (corev1.Volume, string, bool) {
	dir, base := filepath.Split(path)
	for _, m := range c.VolumeMounts {
		if filepath.Clean(m.MountPath) != filepath.Clean(dir) || m.SubPath != "" {
			continue
		}
		for _, v := range pod.Volumes {
			if v.Name != m.Name {
				continue
			}
			var items []corev1.KeyToPath
			switch {
			case v.Secret != nil:
				items = v.Secret.Items
			case v.ConfigMap != nil:
				items = v.ConfigMap.Items
			}
			for _, it := range items {
				if it.Path == base {
					return v, it.Key, true
				}
			}
			return v, base, len(items) == 0
		}
	}
	return corev1.Volume{}, "", false
}

// kustomizeObjects decodes the manifests kustomization.yaml lists, strictly,
// plus the ConfigMap its generator makes from quotad.yaml.
func kustomizeObjects(t *testing.T) objects {
	t.Helper()
	k := readYAML[kustomization](t, "kustomization.yaml")[0]
	var all []byte
	for _, r := range k.Resources {
		raw, err := os.ReadFile(r)
		if err != nil {
			t.Fatal(err)
		}
		all = append(append(all, raw...), "\n---\n"...)
	}
	o := decodeStrict(t, "kustomize manifests", all)
	for _, g := range k.ConfigMapGenerator {
		cm := &corev1.ConfigMap{Data: map[string]string{}}
		cm.Name = g.Name
		for _, f := range g.Files {
			raw, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			cm.Data[filepath.Base(f)] = string(raw)
		}
		o.configMaps = append(o.configMaps, cm)
	}
	return o
}

func sameYAML(t *testing.T, a, b string) bool {
	t.Helper()
	var x, y any
	if err := yaml.Unmarshal([]byte(a), &x); err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal([]byte(b), &y); err != nil {
		t.Fatal(err)
	}
	return reflect.DeepEqual(x, y)
}

// helm lint passes, and the chart's defaults render the objects `kubectl
// apply -k deploy` creates: the same kinds and names, the same container
// (image, ports, probes, environment, mounts, resources, security), the
// same Service ports, PodDisruptionBudget and config file. The chart's
// selectors add the release's instance label, and its ConfigMap keeps its
// name (kustomize's gets a content hash), so that quotad re-reads it. What
// only a chart can do is left out of the comparison (chartOnly).
func TestHelmChartMatchesKustomize(t *testing.T) {
	if out, err := helm(t, "lint", "--strict", chartDir); err != nil {
		t.Fatalf("helm lint: %v\n%s", err, out)
	}
	out, err := render(t, "")
	if err != nil {
		t.Fatal(err)
	}
	chart := chartOnly(decodeStrict(t, "helm template (defaults)", out))
	kust := kustomizeObjects(t)
	if !slices.Equal(chart.kinds(), kust.kinds()) {
		t.Fatalf("chart renders %v, kustomize %v", chart.kinds(), kust.kinds())
	}
	names := func(o objects) []string {
		var n []string
		for _, d := range o.deployments {
			n = append(n, "Deployment/"+d.Name)
		}
		for _, s := range o.services {
			n = append(n, "Service/"+s.Name)
		}
		for _, p := range o.pdbs {
			n = append(n, "PodDisruptionBudget/"+p.Name)
		}
		for _, c := range o.configMaps {
			n = append(n, "ConfigMap/"+c.Name)
		}
		sort.Strings(n)
		return n
	}
	if !slices.Equal(names(chart), names(kust)) {
		t.Errorf("chart's objects %v, kustomize's %v", names(chart), names(kust))
	}

	cd, kd := chart.deployments[0], kust.deployments[0]
	if *cd.Spec.Replicas != *kd.Spec.Replicas || !reflect.DeepEqual(cd.Spec.Strategy, kd.Spec.Strategy) {
		t.Errorf("replicas %d / strategy %+v, kustomize %d / %+v", *cd.Spec.Replicas, cd.Spec.Strategy, *kd.Spec.Replicas, kd.Spec.Strategy)
	}
	cp, kp := cd.Spec.Template.Spec, kd.Spec.Template.Spec
	if !reflect.DeepEqual(cp.AutomountServiceAccountToken, kp.AutomountServiceAccountToken) {
		t.Errorf("automountServiceAccountToken %v, kustomize %v", cp.AutomountServiceAccountToken, kp.AutomountServiceAccountToken)
	}
	if !reflect.DeepEqual(cp.SecurityContext, kp.SecurityContext) || *cp.TerminationGracePeriodSeconds != *kp.TerminationGracePeriodSeconds {
		t.Errorf("pod security context %+v / grace %d, kustomize %+v / %d", cp.SecurityContext, *cp.TerminationGracePeriodSeconds, kp.SecurityContext, *kp.TerminationGracePeriodSeconds)
	}
	cc, kc := chart.container(t), kust.container(t)
	for what, pair := range map[string][2]any{
		"image":           {strings.Split(cc.Image, ":")[0], strings.Split(kc.Image, ":")[0]},
		"ports":           {cc.Ports, kc.Ports},
		"readiness probe": {cc.ReadinessProbe, kc.ReadinessProbe},
		"liveness probe":  {cc.LivenessProbe, kc.LivenessProbe},
		"environment":     {cc.Env, kc.Env},
		"volume mounts":   {cc.VolumeMounts, kc.VolumeMounts},
		"resources":       {cc.Resources, kc.Resources},
		"security":        {cc.SecurityContext, kc.SecurityContext},
	} {
		if !reflect.DeepEqual(pair[0], pair[1]) {
			t.Errorf("container %s: chart %+v, kustomize %+v", what, pair[0], pair[1])
		}
	}
	// The same files come from the same ConfigMap and Secrets.
	for _, env := range []string{"QUOTAD_CONFIG", "QUOTAD_CLUSTER_KEY_FILE"} {
		path, _ := envValue(cc, env)
		cv, ck, cok := fileFromVolume(cp, cc, path)
		kv, kk, kok := fileFromVolume(kp, kc, path)
		if !cok || !kok || ck != kk || !reflect.DeepEqual(volumeSource(cv), volumeSource(kv)) {
			t.Errorf("%s=%s: chart's from %s key %q (%t), kustomize's from %s key %q (%t)", env, path, volumeSource(cv), ck, cok, volumeSource(kv), kk, kok)
		}
	}
	for _, headless := range []bool{false, true} {
		cs, ks := chart.service(t, headless), kust.service(t, headless)
		if cs.Name != ks.Name || !reflect.DeepEqual(cs.Spec.Ports, ks.Spec.Ports) || cs.Spec.Type != ks.Spec.Type ||
			cs.Spec.PublishNotReadyAddresses != ks.Spec.PublishNotReadyAddresses {
			t.Errorf("Service %s: chart %+v, kustomize %s %+v", cs.Name, cs.Spec, ks.Name, ks.Spec)
		}
	}
	if !reflect.DeepEqual(chart.pdbs[0].Spec.MaxUnavailable, kust.pdbs[0].Spec.MaxUnavailable) {
		t.Errorf("PodDisruptionBudget maxUnavailable %v, kustomize %v", chart.pdbs[0].Spec.MaxUnavailable, kust.pdbs[0].Spec.MaxUnavailable)
	}
	if !sameYAML(t, chart.configMaps[0].Data["quotad.yaml"], kust.configMaps[0].Data["quotad.yaml"]) {
		t.Errorf("the chart's default config differs from deploy/quotad.yaml:\n%s", chart.configMaps[0].Data["quotad.yaml"])
	}
}

// chartOnly is o, the chart's default objects, less what the kustomize
// manifests cannot have, for comparing the rest: the admin token the chart
// generates (a Secret, its file and mount: kustomize cannot make one up),
// the Host names the chart derives from the release's namespace, and the
// NetworkPolicy, whose selectors name the release.
func chartOnly(o objects) objects {
	o.secrets, o.networkPolicies = nil, nil
	d := *o.deployments[0]
	d.Spec.Template.Spec.Containers = slices.Clone(d.Spec.Template.Spec.Containers)
	c := &d.Spec.Template.Spec.Containers[0]
	c.Env = slices.DeleteFunc(slices.Clone(c.Env), func(e corev1.EnvVar) bool {
		return e.Name == "QUOTAD_ADMIN_TOKEN_FILE" || e.Name == "QUOTAD_ALLOWED_HOSTS"
	})
	c.VolumeMounts = slices.DeleteFunc(slices.Clone(c.VolumeMounts), func(m corev1.VolumeMount) bool { return m.Name == "admin-token" })
	o.deployments = []*appsv1.Deployment{&d}
	return o
}

// volumeSource names where a volume's files come from.
func volumeSource(v corev1.Volume) string {
	switch {
	case v.Secret != nil:
		return "Secret " + v.Secret.SecretName
	case v.ConfigMap != nil:
		return "ConfigMap " + v.ConfigMap.Name
	}
	return "volume " + v.Name
}

// everything turns on every option of the chart.
const everything = `
image: {repository: registry.example.com/quotad, tag: v1.2.3}
replicas: 5
redis: {url: "redis://:pw@redis:6379/0"}
cluster: {key: "c2VjcmV0LWtleS0xNi1ieXQ=", existingSecret: ""}
tls: {secretName: quotad-tls, clientCASecretName: quotad-client-ca}
adminToken: {secretName: quotad-admin}
serviceMonitor:
  enabled: true
  labels: {release: prometheus}
  tlsConfig: {ca: {secret: {name: quotad-tls, key: ca.crt}}, cert: {secret: {name: prometheus-client, key: tls.crt}}, keySecret: {name: prometheus-client, key: tls.key}}
podDisruptionBudget: {maxUnavailable: 2}
extraEnv: [{name: QUOTAD_LOG_LEVEL, value: debug}]
resources: {requests: {cpu: 500m, memory: 128Mi}, limits: {memory: 1Gi}}
podAnnotations: {example.com/team: platform}
nodeSelector: {kubernetes.io/os: linux}
config:
  policies: [{name: api, algorithm: fixed_window, limit: 10, period: 1s}]
`

// Every option renders valid objects wired to each other: the chart's own
// Secrets for redis.url and cluster.key, TLS files from the TLS Secret,
// client CAs from theirs, the admin token, a ServiceMonitor of the client
// Service's port over https. Under mutual TLS the probes are TCP checks;
// under TLS alone they use HTTPS. Without a gossip key or Redis the chart
// refuses to render. Every QUOTAD_* variable of every rendering is one of
// quotad's flags.
func TestHelmChartOptions(t *testing.T) {
	renderings := map[string]string{"defaults": "", "everything": everything,
		"tls only": "tls: {secretName: quotad-tls}\nserviceMonitor: {enabled: true}\npodDisruptionBudget: {enabled: false}\n"}
	used := map[string]bool{}
	decoded := map[string]objects{}
	for name, values := range renderings {
		out, err := render(t, values)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		o := decodeStrict(t, name, out)
		decoded[name] = o
		c := o.container(t)
		for _, e := range c.Env {
			used[e.Name] = true
		}
		// Every *_FILE and the config are files of mounted volumes.
		pod := o.deployments[0].Spec.Template.Spec
		for _, e := range c.Env {
			if strings.HasSuffix(e.Name, "_FILE") || e.Name == "QUOTAD_CONFIG" {
				if _, _, ok := fileFromVolume(pod, c, e.Value); !ok {
					t.Errorf("%s: %s=%s is not a file of a mounted volume", name, e.Name, e.Value)
				}
			}
		}
	}

	all := decoded["everything"]
	if got := all.kinds(); !slices.Equal(got, []string{"ConfigMap", "Deployment", "NetworkPolicy", "PodDisruptionBudget", "Secret", "Secret", "Service", "Service", "ServiceMonitor"}) {
		t.Errorf("everything renders %v", got)
	}
	c := all.container(t)
	pod := all.deployments[0].Spec.Template.Spec
	if c.Image != "registry.example.com/quotad:v1.2.3" || *all.deployments[0].Spec.Replicas != 5 || all.pdbs[0].Spec.MaxUnavailable.IntValue() != 2 {
		t.Errorf("image %s, replicas %d, maxUnavailable %v", c.Image, *all.deployments[0].Spec.Replicas, all.pdbs[0].Spec.MaxUnavailable)
	}
	secrets := map[string]*corev1.Secret{}
	for _, s := range all.secrets {
		secrets[s.Name] = s
	}
	if ref, _ := envValue(c, "QUOTAD_REDIS"); ref != "secret:quotad-redis/url" || secrets["quotad-redis"].StringData["url"] != "redis://:pw@redis:6379/0" {
		t.Errorf("QUOTAD_REDIS=%s; secrets %v", ref, secrets)
	}
	for env, want := range map[string]string{
		"QUOTAD_CLUSTER_KEY_FILE":   "Secret quotad-cluster-key key key",
		"QUOTAD_TLS_CERT_FILE":      "Secret quotad-tls key tls.crt",
		"QUOTAD_TLS_KEY_FILE":       "Secret quotad-tls key tls.key",
		"QUOTAD_TLS_CLIENT_CA_FILE": "Secret quotad-client-ca key ca.crt",
		"QUOTAD_ADMIN_TOKEN_FILE":   "Secret quotad-admin key token",
	} {
		path, _ := envValue(c, env)
		v, key, ok := fileFromVolume(pod, c, path)
		if got := volumeSource(v) + " key " + key; !ok || got != want {
			t.Errorf("%s=%s comes from %s, want %s", env, path, got, want)
		}
	}
	if s := secrets["quotad-cluster-key"]; s == nil || s.StringData["key"] == "" {
		t.Errorf("no gossip key Secret: %v", secrets)
	}
	if v, _ := envValue(c, "QUOTAD_LOG_LEVEL"); v != "debug" {
		t.Errorf("extraEnv: QUOTAD_LOG_LEVEL=%q", v)
	}
	for _, p := range []*corev1.Probe{c.ReadinessProbe, c.LivenessProbe} {
		if p.TCPSocket == nil || p.TCPSocket.Port.String() != "http" || p.HTTPGet != nil {
			t.Errorf("under mutual TLS a probe is %+v, want a TCP check of http", p.ProbeHandler)
		}
	}
	sm := all.serviceMonitors[0]
	api := all.service(t, false)
	if !subset(sm.Spec.Selector.MatchLabels, api.Labels) || subset(sm.Spec.Selector.MatchLabels, all.service(t, true).Labels) {
		t.Errorf("ServiceMonitor selects %v; the client Service has %v", sm.Spec.Selector.MatchLabels, api.Labels)
	}
	ep := sm.Spec.Endpoints[0]
	if ep.Port != api.Spec.Ports[0].Name || ep.Path != "/metrics" || ep.Scheme == nil || *ep.Scheme != "https" || ep.TLSConfig == nil || ep.TLSConfig.KeySecret == nil {
		t.Errorf("ServiceMonitor endpoint %+v", ep)
	}
	if sm.Labels["release"] != "prometheus" {
		t.Errorf("ServiceMonitor labels %v", sm.Labels)
	}

	tlsOnly := decoded["tls only"]
	if len(tlsOnly.pdbs) != 0 || len(tlsOnly.serviceMonitors) != 1 {
		t.Errorf("tls only renders %v", tlsOnly.kinds())
	}
	tc := tlsOnly.container(t)
	for _, p := range []*corev1.Probe{tc.ReadinessProbe, tc.LivenessProbe} {
		if p.HTTPGet == nil || p.HTTPGet.Scheme != corev1.URISchemeHTTPS {
			t.Errorf("under TLS a probe is %+v, want HTTPS", p.ProbeHandler)
		}
	}
	if d := decoded["defaults"]; len(d.serviceMonitors) != 0 || len(d.secrets) != 1 || d.secrets[0].Name != "quotad-admin-token" {
		t.Errorf("defaults render %v", d.kinds())
	}

	for name, args := range map[string][]string{
		"no gossip key": {"--set", "cluster.existingSecret="},
		"no redis":      {"--set", "redis.existingSecret="},
	} {
		out, err := render(t, "", args...)
		if err == nil || !strings.Contains(err.Error(), "is required") {
			t.Errorf("%s: rendered (%v)\n%s", name, err, out)
		}
	}

	// Every variable the chart sets is a flag in quotad --help (the
	// QUOTAD_ + flag rule), so none is silently ignored.
	help, _ := exec.Command(quotadtest.Binary(t), "--help").CombinedOutput()
	for env := range used {
		name, ok := strings.CutPrefix(env, "QUOTAD_")
		if !ok {
			continue
		}
		flag := strings.ToLower(strings.ReplaceAll(name, "_", "-"))
		if !regexp.MustCompile(`(?m)^\s+-` + regexp.QuoteMeta(flag) + `\b`).Match(help) {
			t.Errorf("the chart sets %s, but quotad --help has no -%s", env, flag)
		}
	}
	if len(used) < 12 {
		t.Errorf("only %d variables seen: %v", len(used), used)
	}
}

// The README's deploy commands work as written, as far as they can be
// followed here: the image `kustomize edit set image` names is the one the
// Deployment runs and kustomization.yaml's images entry rewrites, the
// Secrets `kubectl create secret` makes are the ones both the manifests and
// the chart's defaults read, and `helm install` names this chart and values
// it has.
func TestREADMEDeployPath(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(raw), "\n## Deploying\n")
	if !ok {
		t.Fatal("README has no Deploying section")
	}
	_, block, _ := strings.Cut(section, "```sh\n")
	block, _, _ = strings.Cut(block, "```")
	lines := strings.Split(block, "\n")
	index := func(prefix string) int {
		return slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(strings.TrimLeft(l, "("), prefix) })
	}

	kust := readYAML[struct {
		Images []struct {
			Name string
		}
	}](t, "kustomization.yaml")[0]
	image := kustomizeObjects(t).container(t).Image
	edit, apply, push := index("cd deploy && kustomize edit set image "), index("kubectl apply -k deploy"), index("docker push ")
	if edit < 0 || apply < 0 || edit > apply || push < 0 || push > edit {
		t.Fatalf("the README must push the image, then `kustomize edit set image`, then `kubectl apply -k deploy`:\n%s", block)
	}
	m := regexp.MustCompile(`kustomize edit set image ([^=\s]+)=(\S+?)\)?$`).FindStringSubmatch(strings.TrimSpace(lines[edit]))
	if m == nil || len(kust.Images) != 1 || m[1] != kust.Images[0].Name || m[1] != image {
		t.Errorf("`kustomize edit set image` names %q; kustomization.yaml's images %v; the Deployment runs %q", m, kust.Images, image)
	}
	if pushed := strings.Fields(lines[push])[2]; m != nil && pushed != m[2] {
		t.Errorf("the README pushes %s but sets the image %s", pushed, m[2])
	}

	// The Secrets it creates are the ones the Deployment and the chart read.
	made := map[string]bool{}
	for _, l := range lines {
		if f := strings.Fields(l); len(f) >= 5 && f[0] == "kubectl" && f[1] == "create" && f[2] == "secret" {
			key, _, _ := strings.Cut(strings.TrimPrefix(f[5], "--from-literal="), "=")
			made["secret:"+f[4]+"/"+key] = true
		}
	}
	chart, err := render(t, "")
	if err != nil {
		t.Fatal(err)
	}
	for name, o := range map[string]objects{"manifests": kustomizeObjects(t), "chart": decodeStrict(t, "chart", chart)} {
		c := o.container(t)
		redis, _ := envValue(c, "QUOTAD_REDIS")
		path, _ := envValue(c, "QUOTAD_CLUSTER_KEY_FILE")
		v, key, _ := fileFromVolume(o.deployments[0].Spec.Template.Spec, c, path)
		for _, want := range []string{redis, "secret:" + v.Secret.SecretName + "/" + key} {
			if !made[want] {
				t.Errorf("the %s read %s, which the README does not create (%v)", name, want, made)
			}
		}
	}

	// helm install names this chart and values it has.
	install := index("helm install ")
	if install < 0 {
		t.Fatalf("no helm install in:\n%s", block)
	}
	f := strings.Fields(lines[install])
	if _, err := os.Stat(filepath.Join(repoRoot, f[3], "Chart.yaml")); err != nil {
		t.Errorf("helm install %s: %v", f[3], err)
	}
	var sets []string
	for i, w := range f {
		if w == "--set" && i+1 < len(f) {
			sets = append(sets, "--set", f[i+1])
		}
	}
	out, err := render(t, "", sets...)
	if err != nil {
		t.Fatal(err)
	}
	if got := decodeStrict(t, "helm install's values", out).container(t).Image; m != nil && got != m[2] {
		t.Errorf("helm install runs image %s, kustomize %s", got, m[2])
	}
}

// The chart's defaults are safe to run as they are: a NetworkPolicy lets
// the API port be reached only from the release's namespace (and the peers
// networkPolicy.apiFrom adds) and gossip only from quotad's own pods; the
// pods get no service account token; Reset needs a bearer token, which the
// chart generates (32 random characters, another each install) into a
// Secret it mounts, unless a Secret of yours is named or generation is
// turned off; the console and /status answer the client Service's DNS
// names; the container's memory is limited. (That an upgrade keeps the
// generated token, through helm's lookup, needs a cluster: helm template
// has none, so lookup finds nothing here.)
func TestHelmChartProductionDefaults(t *testing.T) {
	out, err := render(t, "")
	if err != nil {
		t.Fatal(err)
	}
	d := decodeStrict(t, "defaults", out)
	pod := d.deployments[0].Spec.Template.Spec
	c := d.container(t)

	if len(d.networkPolicies) != 1 {
		t.Fatalf("defaults render %v, want a NetworkPolicy", d.kinds())
	}
	np := d.networkPolicies[0]
	if !reflect.DeepEqual(np.Spec.PodSelector.MatchLabels, d.deployments[0].Spec.Selector.MatchLabels) ||
		!slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) || len(np.Spec.Ingress) != 2 {
		t.Fatalf("NetworkPolicy %+v", np.Spec)
	}
	portNames := func(r networkingv1.NetworkPolicyIngressRule) []string {
		var n []string
		for _, p := range r.Ports {
			n = append(n, p.Port.String()+"/"+string(*p.Protocol))
		}
		return n
	}
	api, gossip := np.Spec.Ingress[0], np.Spec.Ingress[1]
	if got := portNames(api); !slices.Equal(got, []string{"http/TCP"}) || len(api.From) != 1 || api.From[0].PodSelector == nil ||
		len(api.From[0].PodSelector.MatchLabels) != 0 || api.From[0].NamespaceSelector != nil {
		t.Errorf("API rule: ports %v from %+v; want http from every pod of the namespace", got, api.From)
	}
	if got := portNames(gossip); !slices.Equal(got, []string{"gossip-tcp/TCP", "gossip-udp/UDP"}) || len(gossip.From) != 1 ||
		!reflect.DeepEqual(gossip.From[0].PodSelector.MatchLabels, np.Spec.PodSelector.MatchLabels) {
		t.Errorf("gossip rule: ports %v from %+v; want gossip from quotad's pods only", got, gossip.From)
	}
	named := map[string]bool{}
	for _, p := range c.Ports {
		named[p.Name] = true
	}
	for _, r := range np.Spec.Ingress {
		for _, p := range r.Ports {
			if !named[p.Port.String()] {
				t.Errorf("NetworkPolicy port %s is no port of the container", p.Port)
			}
		}
	}

	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Errorf("automountServiceAccountToken %v, want false", pod.AutomountServiceAccountToken)
	}

	path, _ := envValue(c, "QUOTAD_ADMIN_TOKEN_FILE")
	v, key, ok := fileFromVolume(pod, c, path)
	if !ok || volumeSource(v) != "Secret quotad-admin-token" || key != "token" || len(d.secrets) != 1 {
		t.Fatalf("QUOTAD_ADMIN_TOKEN_FILE=%s from %s key %q (%t); secrets %d", path, volumeSource(v), key, ok, len(d.secrets))
	}
	token := string(d.secrets[0].Data["token"])
	if !regexp.MustCompile(`^[A-Za-z0-9]{32}$`).MatchString(token) {
		t.Errorf("generated token %q, want 32 letters and digits", token)
	}
	again, err := render(t, "")
	if err != nil {
		t.Fatal(err)
	}
	if other := decodeStrict(t, "defaults again", again).secrets[0].Data["token"]; string(other) == token {
		t.Errorf("two installs generated the same token %q", token)
	}
	for name, values := range map[string]string{
		"your Secret":      "adminToken: {secretName: my-admin}",
		"no token at all":  "adminToken: {generate: false}",
		"every Host":       `allowedHosts: ["*"]`,
		"more names":       "allowedHosts: [quotad.example.com]\nnetworkPolicy: {apiFrom: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: monitoring}}}]}",
		"no NetworkPolicy": "networkPolicy: {enabled: false}",
	} {
		out, err := render(t, values)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		o := decodeStrict(t, name, out)
		c := o.container(t)
		path, hasToken := envValue(c, "QUOTAD_ADMIN_TOKEN_FILE")
		hosts, _ := envValue(c, "QUOTAD_ALLOWED_HOSTS")
		switch name {
		case "your Secret":
			v, _, _ := fileFromVolume(o.deployments[0].Spec.Template.Spec, c, path)
			if volumeSource(v) != "Secret my-admin" || len(o.secrets) != 0 {
				t.Errorf("%s: token from %s, %d Secrets", name, volumeSource(v), len(o.secrets))
			}
		case "no token at all":
			if hasToken || len(o.secrets) != 0 {
				t.Errorf("%s: QUOTAD_ADMIN_TOKEN_FILE set (%t), %d Secrets", name, hasToken, len(o.secrets))
			}
		case "every Host":
			if hosts != "*" {
				t.Errorf("%s: QUOTAD_ALLOWED_HOSTS=%q", name, hosts)
			}
		case "more names":
			if !strings.HasSuffix(hosts, ",quotad.example.com") || len(o.networkPolicies[0].Spec.Ingress[0].From) != 2 {
				t.Errorf("%s: QUOTAD_ALLOWED_HOSTS=%q, API rule from %+v", name, hosts, o.networkPolicies[0].Spec.Ingress[0].From)
			}
		case "no NetworkPolicy":
			if len(o.networkPolicies) != 0 {
				t.Errorf("%s: renders %v", name, o.kinds())
			}
		}
	}

	// The client Service's names, which quotad itself accepts.
	hosts, _ := envValue(c, "QUOTAD_ALLOWED_HOSTS")
	if want := "quotad,quotad.quotad,quotad.quotad.svc,quotad.quotad.svc.cluster.local"; hosts != want {
		t.Errorf("QUOTAD_ALLOWED_HOSTS=%q, want %q", hosts, want)
	}
	if out, err := exec.Command(quotadtest.Binary(t), "--allowed-hosts", hosts, "--print-settings").CombinedOutput(); err != nil {
		t.Errorf("quotad refuses the chart's allowed hosts: %v\n%s", err, out)
	}

	if lim := c.Resources.Limits.Memory(); lim.IsZero() || lim.Value() < 256<<20 {
		t.Errorf("memory limit %v, want one set (at least 256Mi)", lim)
	}
}
