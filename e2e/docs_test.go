package e2e

// The docs are checked where they contain something a reader copies: manifests and kubectl
// commands. The conventions (also in docs/README.md, "Conventions of these pages"):
//
//   - A ```yaml block whose documents have apiVersion and kind is a manifest. Each object is
//     server-side applied, with dry-run and strict field validation, to the lab cluster its
//     kind belongs to (docsKinds), exactly as written: nothing is substituted. The namespaces
//     the objects name are created for the dry-run (and deleted afterwards).
//   - A ```yaml block that is a fragment, an excerpt or output is preceded by
//     <!-- not-a-manifest --> (a reason may follow: <!-- not-a-manifest: excerpt -->). A yaml
//     block without the marker and with neither apiVersion nor kind is a fragment too; one
//     with only one of them, or that is not valid YAML, fails.
//   - Kinds that exist in both lab clusters (Service, ConfigMap, ...) need
//     <!-- apply-to: host --> or <!-- apply-to: guest --> before their block.
//   - In ```sh / ```bash / ```shell blocks every line is a command (an optional "$ " prompt
//     is dropped); in ```console, ```text and unlabelled blocks only lines starting with
//     "$ " are. Each kubectl invocation in them (also after |, && or ;) is run against the
//     lab, the host as the current context and the guest as context "guest":
//     read-only verbs as written, verbs that write with --dry-run=server, the others
//     (exec, port-forward, edit, wait, config, ...) with --help, which still parses the
//     subcommand and its flags. A kubeconfig named on the line (--kubeconfig X, or
//     KUBECONFIG=X before kubectl) is taken to be the guest's. Errors about the data
//     (NotFound, a missing file) pass; usage errors ("unknown flag", "unknown command",
//     "the server doesn't have a resource type", a bad -o, ...) fail. Resource types no lab
//     cluster serves (KubeVirt's vmi, ...) are listed in docsResourcesNotInLab, with a reason.
//   - Relative links point at files that exist, and #anchors at headings (or <a id>) that exist.
//   - docs/rbac.md lists every rule of the manager's ClusterRole and leader election Role,
//     and of the tenants' and operators' ClusterRoles.
//
// Failures name the file and line of the offending block, document or command.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
)

// Where the objects of a kind are checked.
type docsTarget string

const (
	// docsHost: the lab's host apiserver (CAPI, CAPK, Cilium and guestnet CRDs).
	docsHost docsTarget = "host"
	// docsGuest: the lab's guest apiserver.
	docsGuest docsTarget = "guest"
	// docsEither: a built-in kind of both clusters; the block says which (apply-to marker).
	docsEither docsTarget = "either"
	// docsNotInLab: no lab cluster has the kind's CRD; the object is only decoded.
	docsNotInLab docsTarget = "not in the lab"
)

type docsKind struct {
	target docsTarget
	// why the kind is not checked against an apiserver (docsNotInLab), or what must be
	// installed for it.
	why string
}

// docsKinds lists every kind a manifest in the docs may have. A kind that is not listed
// fails the test: add it here with the cluster it belongs to, or with the reason it cannot be
// checked.
var docsKinds = map[schema.GroupKind]docsKind{
	// guestnet, CAPI, CAPK and Cilium live in the host (the lab installs their real CRDs).
	{Group: "guestnet.addons.cluster.x-k8s.io", Kind: "GuestIngress"}:           {target: docsHost},
	{Group: "guestnet.addons.cluster.x-k8s.io", Kind: "GuestWebhookBridge"}:     {target: docsHost},
	{Group: "guestnet.addons.cluster.x-k8s.io", Kind: "GuestIngressPolicy"}:     {target: docsHost},
	{Group: "guestnet.addons.cluster.x-k8s.io", Kind: "GuestNodeIdentity"}:      {target: docsHost},
	{Group: "cluster.x-k8s.io", Kind: "Cluster"}:                                {target: docsHost},
	{Group: "cluster.x-k8s.io", Kind: "ClusterClass"}:                           {target: docsHost},
	{Group: "cluster.x-k8s.io", Kind: "MachineDeployment"}:                      {target: docsHost},
	{Group: "cluster.x-k8s.io", Kind: "MachineSet"}:                             {target: docsHost},
	{Group: "cluster.x-k8s.io", Kind: "Machine"}:                                {target: docsHost},
	{Group: "cluster.x-k8s.io", Kind: "MachineHealthCheck"}:                     {target: docsHost},
	{Group: "infrastructure.cluster.x-k8s.io", Kind: "KubevirtCluster"}:         {target: docsHost},
	{Group: "infrastructure.cluster.x-k8s.io", Kind: "KubevirtClusterTemplate"}: {target: docsHost},
	{Group: "infrastructure.cluster.x-k8s.io", Kind: "KubevirtMachine"}:         {target: docsHost},
	{Group: "infrastructure.cluster.x-k8s.io", Kind: "KubevirtMachineTemplate"}: {target: docsHost},
	{Group: "cilium.io", Kind: "CiliumLoadBalancerIPPool"}:                      {target: docsHost},
	{Group: "cilium.io", Kind: "CiliumL2AnnouncementPolicy"}:                    {target: docsHost},

	// What a bridge works on, and what users apply in the guest.
	{Group: "apiregistration.k8s.io", Kind: "APIService"}:                           {target: docsGuest},
	{Group: "admissionregistration.k8s.io", Kind: "ValidatingWebhookConfiguration"}: {target: docsGuest},
	{Group: "admissionregistration.k8s.io", Kind: "MutatingWebhookConfiguration"}:   {target: docsGuest},
	{Group: "cert-manager.io", Kind: "Issuer"}:                                      {target: docsGuest, why: "cert-manager's CRDs (the lab's pinned release) are installed in the guest"},
	{Group: "cert-manager.io", Kind: "ClusterIssuer"}:                               {target: docsGuest, why: "cert-manager's CRDs (the lab's pinned release) are installed in the guest"},
	{Group: "cert-manager.io", Kind: "Certificate"}:                                 {target: docsGuest, why: "cert-manager's CRDs (the lab's pinned release) are installed in the guest"},

	// Built-in kinds of both clusters: the block names the cluster.
	{Group: "", Kind: "Namespace"}:                                   {target: docsEither},
	{Group: "", Kind: "Service"}:                                     {target: docsEither},
	{Group: "", Kind: "ConfigMap"}:                                   {target: docsEither},
	{Group: "", Kind: "Secret"}:                                      {target: docsEither},
	{Group: "", Kind: "ServiceAccount"}:                              {target: docsEither},
	{Group: "apps", Kind: "Deployment"}:                              {target: docsEither},
	{Group: "rbac.authorization.k8s.io", Kind: "Role"}:               {target: docsEither},
	{Group: "rbac.authorization.k8s.io", Kind: "RoleBinding"}:        {target: docsEither},
	{Group: "rbac.authorization.k8s.io", Kind: "ClusterRole"}:        {target: docsEither},
	{Group: "rbac.authorization.k8s.io", Kind: "ClusterRoleBinding"}: {target: docsEither},

	// No lab cluster has these CRDs.
	{Group: "controlplane.cluster.x-k8s.io", Kind: "K0smotronControlPlane"}:         {target: docsNotInLab, why: "k0smotron's CRDs are not in the lab (the lab's guest control plane is started directly)"},
	{Group: "controlplane.cluster.x-k8s.io", Kind: "K0smotronControlPlaneTemplate"}: {target: docsNotInLab, why: "k0smotron's CRDs are not in the lab"},
	{Group: "bootstrap.cluster.x-k8s.io", Kind: "K0sWorkerConfigTemplate"}:          {target: docsNotInLab, why: "k0smotron's CRDs are not in the lab"},
	{Group: "projectcontour.io", Kind: "HTTPProxy"}:                                 {target: docsNotInLab, why: "Contour's CRDs are not in the lab's guest"},
	{Group: "clusterctl.cluster.x-k8s.io", Kind: "Metadata"}:                        {target: docsNotInLab, why: "clusterctl's metadata.yaml is a release file, not an API object"},
}

// mdBlock is a fenced code block of a Markdown file.
type mdBlock struct {
	file string // relative to the repository root
	line int    // of the opening fence, 1-based
	lang string // first word of the info string, lower case
	// markers are the HTML comments right before the fence: "not-a-manifest" -> "",
	// "apply-to" -> "guest".
	markers map[string]string
	lines   []string
}

func (b mdBlock) pos(offset int) string { return fmt.Sprintf("%s:%d", b.file, b.line+1+offset) }

// mdFile is a Markdown file: its fenced blocks and its prose lines (outside the blocks).
type mdFile struct {
	path   string
	blocks []mdBlock
	prose  map[int]string // 1-based line -> text
}

var (
	fenceRE  = regexp.MustCompile("^( {0,12})(```+|~~~+)\\s*([^`\\s]*)")
	markerRE = regexp.MustCompile(`^<!--\s*([a-z-]+)\s*(?::\s*(.*?))?\s*-->$`)
)

// docFiles reads README.md and every docs/**/*.md.
func docFiles(t *testing.T) []mdFile {
	t.Helper()
	root, err := lab.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	paths := []string{"README.md"}
	err = filepath.WalkDir(filepath.Join(root, "docs"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") {
			rel, _ := filepath.Rel(root, p)
			paths = append(paths, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var files []mdFile
	for _, p := range paths {
		data, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		f, err := parseMarkdown(p, string(data))
		if err != nil {
			t.Error(err)
			continue
		}
		files = append(files, f)
	}
	return files
}

func parseMarkdown(path, text string) (mdFile, error) {
	f := mdFile{path: path, prose: map[int]string{}}
	lines := strings.Split(text, "\n")
	for i := 0; i < len(lines); i++ {
		m := fenceRE.FindStringSubmatch(lines[i])
		if m == nil {
			f.prose[i+1] = lines[i]
			continue
		}
		indent, fence := len(m[1]), m[2]
		b := mdBlock{file: path, line: i + 1, lang: strings.ToLower(m[3]), markers: map[string]string{}}
		for j := i - 1; j >= 0; j-- {
			l := strings.TrimSpace(lines[j])
			if l == "" {
				continue
			}
			mm := markerRE.FindStringSubmatch(l)
			if mm == nil {
				break
			}
			b.markers[mm[1]] = mm[2]
		}
		closed := false
		for i++; i < len(lines); i++ {
			l := lines[i]
			if t := strings.TrimLeft(l, " "); strings.HasPrefix(t, fence) && strings.Trim(t, fence[:1]+" \t") == "" {
				closed = true
				break
			}
			// Drop the fence's indentation (blocks inside list items).
			for k := 0; k < indent && strings.HasPrefix(l, " "); k++ {
				l = l[1:]
			}
			b.lines = append(b.lines, l)
		}
		if !closed {
			return f, fmt.Errorf("%s:%d: code block is never closed", path, b.line)
		}
		f.blocks = append(f.blocks, b)
	}
	return f, nil
}

// docManifest is one object of a manifest block.
type docManifest struct {
	pos    string
	obj    *unstructured.Unstructured
	target docsTarget
	why    string
}

// docManifests returns the objects of every manifest block, and the problems found in the
// yaml blocks (without any cluster).
func docManifests(files []mdFile) ([]docManifest, []string) {
	var out []docManifest
	var problems []string
	for _, f := range files {
		for _, b := range f.blocks {
			if b.lang != "yaml" && b.lang != "yml" {
				continue
			}
			if _, skip := b.markers["not-a-manifest"]; skip {
				continue
			}
			ms, ps := blockManifests(b)
			out = append(out, ms...)
			problems = append(problems, ps...)
		}
	}
	return out, problems
}

func blockManifests(b mdBlock) ([]docManifest, []string) {
	var manifests []docManifest
	var problems []string
	fragments := 0
	start := 0
	for i := 0; i <= len(b.lines); i++ {
		if i < len(b.lines) && strings.TrimRight(b.lines[i], " \t") != "---" {
			continue
		}
		doc, at := strings.Join(b.lines[start:i], "\n"), start
		start = i + 1
		if strings.TrimSpace(stripYAMLComments(doc)) == "" {
			continue
		}
		pos := b.pos(firstContentLine(b.lines[at:]) + at)
		js, err := yaml.YAMLToJSONStrict([]byte(doc))
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: not valid YAML (%v); mark a block that is not YAML text or not a manifest with <!-- not-a-manifest -->", pos, err))
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(js, &m); err != nil {
			fragments++ // a list or a scalar: a fragment
			continue
		}
		_, hasAPIVersion := m["apiVersion"]
		_, hasKind := m["kind"]
		switch {
		case !hasAPIVersion && !hasKind:
			fragments++
			continue
		case !hasAPIVersion || !hasKind:
			problems = append(problems, fmt.Sprintf("%s: has apiVersion or kind but not both: a manifest needs both; a fragment is marked <!-- not-a-manifest -->", pos))
			continue
		}
		obj := &unstructured.Unstructured{Object: m}
		gvk := obj.GroupVersionKind()
		if obj.GetAPIVersion() == "" || gvk.Kind == "" {
			problems = append(problems, fmt.Sprintf("%s: apiVersion and kind must be non-empty strings", pos))
			continue
		}
		if obj.GetName() == "" {
			problems = append(problems, fmt.Sprintf("%s: %s has no metadata.name", pos, gvk.Kind))
			continue
		}
		k, known := docsKinds[gvk.GroupKind()]
		if !known {
			problems = append(problems, fmt.Sprintf("%s: kind %s is not in docsKinds (e2e/docs_test.go): add it with the lab cluster it belongs to, or the reason it cannot be checked", pos, gvk.GroupKind()))
			continue
		}
		target := k.target
		if to, ok := b.markers["apply-to"]; ok {
			switch {
			case to != string(docsHost) && to != string(docsGuest):
				problems = append(problems, fmt.Sprintf("%s: <!-- apply-to: %s -->: host or guest", b.pos(-1), to))
				continue
			case k.target == docsEither:
				target = docsTarget(to)
			case docsTarget(to) != k.target:
				problems = append(problems, fmt.Sprintf("%s: <!-- apply-to: %s --> but %s belongs to the %s", pos, to, gvk.GroupKind(), k.target))
				continue
			}
		}
		if target == docsEither {
			problems = append(problems, fmt.Sprintf("%s: %s exists in both the host and the guest: say which with <!-- apply-to: host --> or <!-- apply-to: guest --> before the block", pos, gvk.Kind))
			continue
		}
		manifests = append(manifests, docManifest{pos: pos, obj: obj, target: target, why: k.why})
	}
	if len(manifests) > 0 && fragments > 0 {
		problems = append(problems, fmt.Sprintf("%s: the block mixes manifests and fragments; split it, or mark it <!-- not-a-manifest -->", b.pos(-1)))
	}
	return manifests, problems
}

func stripYAMLComments(doc string) string {
	var b strings.Builder
	for l := range strings.SplitSeq(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

func firstContentLine(lines []string) int {
	for i, l := range lines {
		if t := strings.TrimSpace(l); t != "" && !strings.HasPrefix(t, "#") {
			return i
		}
	}
	return 0
}

// Every yaml block of the docs is a manifest of a known kind, or a fragment, or marked; every
// shell block can be read. No cluster needed.
func TestDocsBlocksAreWellFormed(t *testing.T) {
	files := docFiles(t)
	manifests, problems := docManifests(files)
	calls, shellProblems := docKubectlCalls(files)
	for _, p := range append(problems, shellProblems...) {
		t.Error(p)
	}
	t.Logf("%d manifest objects and %d kubectl commands in %d files", len(manifests), len(calls), len(files))
}

// Every manifest in the docs is accepted, as written, by the lab cluster it is meant for:
// server-side apply with dry-run and strict field validation, so the CRD schemas, CEL rules
// and defaults of the real CAPI, CAPK, Cilium and guestnet CRDs judge it.
func TestDocsManifestsApplyToTheLab(t *testing.T) {
	l := startLab(t)
	ctx := testContext(t)
	manifests, _ := docManifests(docFiles(t)) // problems: TestDocsBlocksAreWellFormed
	clients := map[docsTarget]client.Client{docsHost: l.Host.Client, docsGuest: l.Guest.Client}

	if slices.ContainsFunc(manifests, func(m docManifest) bool {
		return m.target == docsGuest && m.obj.GroupVersionKind().Group == "cert-manager.io"
	}) {
		installCertManagerCRDs(t, l)
	}

	created := map[docsTarget]map[string]bool{docsHost: {}, docsGuest: {}}
	t.Cleanup(func() {
		for target, names := range created {
			for ns := range names {
				_ = clients[target].Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
			}
		}
	})
	// The check itself: a typo'd field and a CEL rule are refused, not pruned or ignored.
	for _, bad := range [][]string{
		{"apiVersion: guestnet.addons.cluster.x-k8s.io/v1alpha1", "kind: GuestIngress", "metadata: {name: self-check, namespace: default}",
			"spec: {clusterName: tenant-a, guestService: {namespace: a, name: b}, loadBalancer: {ip: 10.2.6.220, ipp: x}}"},
		{"apiVersion: guestnet.addons.cluster.x-k8s.io/v1alpha1", "kind: GuestIngress", "metadata: {name: self-check, namespace: default}",
			"spec: {clusterName: tenant-a, guestService: {namespace: a, name: b}, loadBalancer: {l2: {}}}"},
	} {
		ms, problems := blockManifests(mdBlock{file: "self-check", lang: "yaml", lines: bad})
		if len(problems) > 0 || len(ms) != 1 {
			t.Fatalf("self-check: %v", problems)
		}
		//nolint:staticcheck // Client.Apply takes no FieldValidation option, and strict validation is the point here
		err := l.Host.Client.Patch(ctx, ms[0].obj, client.Apply, client.DryRunAll, client.ForceOwnership,
			client.FieldOwner("guestnet-docs-test"), client.FieldValidation(metav1.FieldValidationStrict))
		if err == nil {
			t.Errorf("self-check: the host apiserver accepted %s", strings.Join(bad, "; "))
		}
	}

	applied := 0
	for _, m := range manifests {
		obj := m.obj.DeepCopy()
		desc := fmt.Sprintf("%s: %s %s", m.pos, obj.GetKind(), objectName(obj))
		if m.target == docsNotInLab {
			t.Logf("%s: not applied: %s", desc, m.why)
			continue
		}
		c := clients[m.target]
		namespaced, err := c.IsObjectNamespaced(obj)
		if err != nil {
			t.Errorf("%s: the %s cluster does not know the kind: %v", desc, m.target, err)
			continue
		}
		if namespaced {
			ns := obj.GetNamespace()
			if ns == "" {
				ns = metav1.NamespaceDefault
			}
			if err := ensureNamespace(ctx, c, ns, created[m.target]); err != nil {
				t.Fatalf("%s: creating namespace %s in the %s: %v", desc, ns, m.target, err)
			}
			obj.SetNamespace(ns)
		}
		//nolint:staticcheck // Client.Apply takes no FieldValidation option, and strict validation is the point here
		err = c.Patch(ctx, obj, client.Apply, client.DryRunAll, client.ForceOwnership,
			client.FieldOwner("guestnet-docs-test"), client.FieldValidation(metav1.FieldValidationStrict))
		if err != nil {
			t.Errorf("%s: rejected by the lab's %s apiserver (server-side apply, dry-run): %v", desc, m.target, err)
			continue
		}
		applied++
		t.Logf("%s: accepted by the %s apiserver (dry-run)", desc, m.target)
	}
	t.Logf("%d of %d manifest objects applied (dry-run)", applied, len(manifests))
}

func objectName(o *unstructured.Unstructured) string {
	if o.GetNamespace() == "" {
		return o.GetName()
	}
	return o.GetNamespace() + "/" + o.GetName()
}

func ensureNamespace(ctx context.Context, c client.Client, ns string, created map[string]bool) error {
	err := c.Get(ctx, client.ObjectKey{Name: ns}, &corev1.Namespace{})
	if !apierrors.IsNotFound(err) {
		return err
	}
	err = c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	if err == nil {
		created[ns] = true
	}
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// installCertManagerCRDs installs the CRDs of the lab's pinned cert-manager release in the
// guest (idempotent, as Lab.InstallCertManager does).
func installCertManagerCRDs(t *testing.T, l *lab.Lab) {
	t.Helper()
	tp, err := l.Assets.LookupThirdParty()
	if err != nil {
		t.Fatalf("cert-manager manifests in the docs need the lab's cert-manager CRDs: %v", err)
	}
	if _, err := envtest.InstallCRDs(l.Guest.Config, envtest.CRDInstallOptions{
		Paths: []string{tp.CertManagerCRDDir}, ErrorIfPathMissing: true, MaxTime: time.Minute, PollInterval: 100 * time.Millisecond,
	}); err != nil {
		t.Fatalf("installing cert-manager CRDs in the guest: %v", err)
	}
}

// --- kubectl commands ------------------------------------------------------------------

// shellCommand is one command line of a shell block: its pipeline/list segments (words),
// and the body of its first here-document.
type shellCommand struct {
	line     int // index in the block's lines
	segments [][]string
	stdin    string
}

// kubectlCall is a kubectl invocation found in the docs.
type kubectlCall struct {
	pos   string
	text  string // as written (for messages)
	args  []string
	stdin string
	// guestKubeconfig: the line named a kubeconfig of its own (the guest's).
	guestKubeconfig bool
}

var shellBlockLangs = map[string]bool{"sh": true, "bash": true, "shell": true, "zsh": true}
var promptBlockLangs = map[string]bool{"console": true, "text": true, "": true, "shell-session": true}

// docKubectlCalls finds the kubectl invocations of the docs' shell blocks.
func docKubectlCalls(files []mdFile) ([]kubectlCall, []string) {
	var calls []kubectlCall
	var problems []string
	for _, f := range files {
		for _, b := range f.blocks {
			promptOnly := promptBlockLangs[b.lang]
			if !shellBlockLangs[b.lang] && !promptOnly {
				continue
			}
			cmds, err := parseShell(b.lines, promptOnly)
			if err != nil {
				problems = append(problems, fmt.Sprintf("%s: %v", b.pos(-1), err))
				continue
			}
			for _, c := range cmds {
				for _, seg := range c.segments {
					call, ok := kubectlInvocation(seg)
					if !ok {
						continue
					}
					call.pos = b.pos(c.line)
					call.stdin = c.stdin
					calls = append(calls, call)
				}
			}
		}
	}
	return calls, problems
}

var assignmentRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=`)

// kubectlInvocation reads a segment: leading shell keywords and variable assignments, then
// kubectl and its arguments.
func kubectlInvocation(seg []string) (kubectlCall, bool) {
	call := kubectlCall{}
	i := 0
	for ; i < len(seg); i++ {
		w := seg[i]
		if assignmentRE.MatchString(w) {
			call.guestKubeconfig = call.guestKubeconfig || strings.HasPrefix(w, "KUBECONFIG=")
		} else if !slices.Contains([]string{"do", "then", "else", "{", "!", "time"}, w) {
			break
		}
	}
	if i >= len(seg) || seg[i] != "kubectl" {
		return call, false
	}
	call.text = strings.Join(seg[i:], " ")
	for j := i + 1; j < len(seg); j++ {
		a := seg[j]
		switch {
		case a == "--kubeconfig" && j+1 < len(seg):
			call.guestKubeconfig = true
			j++
		case strings.HasPrefix(a, "--kubeconfig="):
			call.guestKubeconfig = true
		default:
			call.args = append(call.args, a)
		}
	}
	if call.guestKubeconfig && !slices.ContainsFunc(call.args, func(a string) bool {
		return a == "--context" || strings.HasPrefix(a, "--context=")
	}) {
		call.args = append([]string{"--context", "guest"}, call.args...)
	}
	return call, true
}

var placeholderRE = regexp.MustCompile(`^<[A-Za-z][A-Za-z0-9_.:/-]*>`)

// parseShell splits a shell block into commands. It knows what documentation uses: quotes
// (also over several lines), backslash continuations, comments, |, ||, &&, ;, &,
// redirections (dropped), here-documents (the body of the first is the command's stdin),
// $(...) (kept as written), variables assigned earlier in the block (substituted; others are
// kept as written), and <placeholders> (kept as written). With promptOnly, only lines
// starting with "$ " are commands; the others are output.
func parseShell(lines []string, promptOnly bool) ([]shellCommand, error) {
	var cmds []shellCommand
	vars := map[string]string{}
	for i := 0; i < len(lines); i++ {
		text := strings.TrimLeft(lines[i], " \t")
		switch {
		case strings.HasPrefix(text, "$ "):
			text = text[2:]
		case promptOnly:
			continue
		}
		rest := append([]string{text}, lines[i+1:]...)
		segs, heredocs, consumed, err := lexShell(strings.Join(rest, "\n"), vars)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", i+1, err)
		}
		cmd := shellCommand{line: i, segments: segs}
		i += consumed
		for n, delim := range heredocs {
			var body []string
			for i++; i < len(lines) && strings.TrimSpace(lines[i]) != delim; i++ {
				body = append(body, lines[i])
			}
			if i >= len(lines) {
				return nil, fmt.Errorf("line %d: here-document %s is never closed", cmd.line+1, delim)
			}
			if n == 0 {
				cmd.stdin = strings.Join(body, "\n") + "\n"
			}
		}
		for _, seg := range segs { // NAME=value and export NAME=value define a variable
			if seg[0] == "export" {
				seg = seg[1:]
			}
			if len(seg) == 1 && assignmentRE.MatchString(seg[0]) {
				k, v, _ := strings.Cut(seg[0], "=")
				vars[k] = v
			}
		}
		cmds = append(cmds, cmd)
	}
	return cmds, nil
}

var varRE = regexp.MustCompile(`^\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))`)

// lexShell reads one command from s (which may go on over several lines) and returns its
// segments, here-document delimiters, and how many newlines it consumed.
func lexShell(s string, vars map[string]string) (segs [][]string, heredocs []string, consumed int, err error) {
	var seg []string
	var word strings.Builder
	inWord := false
	drop, heredoc := false, false
	flush := func() {
		if !inWord {
			return
		}
		w := word.String()
		word.Reset()
		inWord = false
		switch {
		case heredoc:
			heredocs = append(heredocs, w)
			heredoc = false
		case drop:
			drop = false
		default:
			seg = append(seg, w)
		}
	}
	endSegment := func() {
		flush()
		if len(seg) > 0 {
			segs = append(segs, seg)
		}
		seg = nil
	}
	expand := func(pos int) int { // at a '$' outside single quotes; returns the new pos
		if strings.HasPrefix(s[pos:], "$(") {
			depth, j := 0, pos+1
			for ; j < len(s); j++ {
				if s[j] == '(' {
					depth++
				} else if s[j] == ')' {
					depth--
					if depth == 0 {
						break
					}
				}
			}
			if j >= len(s) {
				j = len(s) - 1
			}
			word.WriteString(s[pos : j+1])
			return j + 1
		}
		if m := varRE.FindStringSubmatch(s[pos:]); m != nil {
			name := m[1] + m[2]
			if v, ok := vars[name]; ok {
				word.WriteString(v)
			} else {
				word.WriteString(m[0])
			}
			return pos + len(m[0])
		}
		word.WriteByte('$')
		return pos + 1
	}
	pos := 0
	for pos < len(s) {
		c := s[pos]
		switch {
		case c == '\n':
			consumed = strings.Count(s[:pos], "\n")
			endSegment()
			return segs, heredocs, consumed, nil
		case c == ' ' || c == '\t':
			flush()
			pos++
		case c == '\\':
			if pos+1 < len(s) && s[pos+1] != '\n' {
				word.WriteByte(s[pos+1])
				inWord = true
			}
			pos += 2
		case c == '\'':
			j := strings.IndexByte(s[pos+1:], '\'')
			if j < 0 {
				return nil, nil, 0, errors.New("unterminated single quote")
			}
			word.WriteString(s[pos+1 : pos+1+j])
			inWord = true
			pos += j + 2
		case c == '"':
			inWord = true
			pos++
			for {
				if pos >= len(s) {
					return nil, nil, 0, errors.New("unterminated double quote")
				}
				if s[pos] == '"' {
					pos++
					break
				}
				switch {
				case s[pos] == '\\' && pos+1 < len(s) && strings.IndexByte("\"\\$`\n", s[pos+1]) >= 0:
					if s[pos+1] != '\n' {
						word.WriteByte(s[pos+1])
					}
					pos += 2
				case s[pos] == '$':
					pos = expand(pos)
				default:
					word.WriteByte(s[pos])
					pos++
				}
			}
		case c == '#' && !inWord:
			for pos < len(s) && s[pos] != '\n' {
				pos++
			}
		case c == '$':
			inWord = true
			pos = expand(pos)
		case c == '<' && placeholderRE.MatchString(s[pos:]):
			m := placeholderRE.FindString(s[pos:])
			word.WriteString(m)
			inWord = true
			pos += len(m)
		case c == '<':
			flush()
			if strings.HasPrefix(s[pos:], "<<") {
				pos += 2
				if pos < len(s) && s[pos] == '-' {
					pos++
				}
				heredoc = true
			} else {
				pos++
				drop = true
			}
		case c == '>':
			if inWord && strings.Trim(word.String(), "0123456789") == "" {
				word.Reset() // a file descriptor: 2>
				inWord = false
			}
			flush()
			pos++
			if pos < len(s) && s[pos] == '>' {
				pos++
			}
			if pos < len(s) && s[pos] == '&' {
				pos++
				for pos < len(s) && s[pos] >= '0' && s[pos] <= '9' {
					pos++
				}
			} else {
				drop = true
			}
		case c == '|' || c == '&' || c == ';' || c == '(' || c == ')':
			endSegment()
			pos++
			if pos < len(s) && (s[pos] == c) {
				pos++
			}
		default:
			word.WriteByte(c)
			inWord = true
			pos++
		}
	}
	endSegment()
	return segs, heredocs, strings.Count(s, "\n"), nil
}

// kubectl verbs by how the test runs them.
var (
	kubectlReadOnly = []string{"get", "describe", "top", "logs", "explain", "api-resources", "api-versions",
		"version", "cluster-info", "events"}
	kubectlDryRun = []string{"apply", "create", "delete", "patch", "label", "annotate", "replace", "scale",
		"set", "expose", "run", "taint", "cordon", "uncordon", "drain", "autoscale"}
	// kubectl's global flags that take a value in the next argument.
	kubectlGlobalValueFlags = []string{"--context", "--namespace", "-n", "--cluster", "--user", "--server", "-s",
		"--token", "--request-timeout", "-v", "--cache-dir", "--as", "--as-group"}
)

// kubectlMode says how a call is checked: "run", "dry-run" or "help".
func kubectlMode(args []string) string {
	var words []string
	for i := 0; i < len(args) && len(words) < 2; i++ {
		a := args[i]
		if strings.HasPrefix(a, "-") {
			if len(words) == 0 && slices.Contains(kubectlGlobalValueFlags, a) {
				i++
			}
			continue
		}
		words = append(words, a)
	}
	if len(words) == 0 {
		return "help"
	}
	verb, sub := words[0], ""
	if len(words) > 1 {
		sub = words[1]
	}
	switch {
	case slices.Contains(kubectlReadOnly, verb):
		return "run"
	case verb == "auth" && (sub == "can-i" || sub == "whoami"):
		return "run"
	case verb == "rollout" && (sub == "status" || sub == "history"):
		return "run"
	case verb == "rollout" && (sub == "restart" || sub == "undo"):
		return "dry-run"
	case verb == "apply" && sub == "view-last-applied":
		return "run"
	case verb == "apply" && (sub == "edit-last-applied" || sub == "set-last-applied"):
		return "help"
	case verb == "create" && sub == "token":
		return "help"
	case slices.Contains(kubectlDryRun, verb):
		return "dry-run"
	}
	return "help"
}

// Resource types that docs commands may name and no lab cluster serves, with the reason. A
// command naming one is checked without it.
var docsResourcesNotInLab = map[string]string{}

func init() {
	for reason, names := range map[string][]string{
		"KubeVirt's CRDs are not in the lab (its workers are stand-ins)": {"vmi", "vmis",
			"virtualmachineinstance", "virtualmachineinstances", "virtualmachineinstances.kubevirt.io",
			"vm", "vms", "virtualmachine", "virtualmachines", "virtualmachines.kubevirt.io"},
		"Contour's CRDs are not in the lab's guest":                                 {"httpproxy", "httpproxies", "httpproxies.projectcontour.io"},
		"Cilium's agent CRDs are not in the lab's guest (its tunnel is a stand-in)": {"ciliumnode", "ciliumnodes", "ciliumnodes.cilium.io"},
		"cert-manager's CRDs are in the lab's guest only while a test runs cert-manager": {"issuer", "issuers",
			"clusterissuer", "clusterissuers", "certificate", "certificates", "certificates.cert-manager.io",
			"issuers.cert-manager.io", "clusterissuers.cert-manager.io"},
	} {
		for _, n := range names {
			docsResourcesNotInLab[n] = reason
		}
	}
}

var noResourceTypeRE = regexp.MustCompile(`the server doesn't have a resource type "([^"]+)"`)

// withoutResourceType removes typ from the comma-separated resource list of a kubectl call's
// arguments; false when nothing is left to check.
func withoutResourceType(args []string, typ string) ([]string, bool) {
	out := slices.Clone(args)
	for i, a := range out {
		if strings.HasPrefix(a, "-") {
			continue
		}
		parts := strings.Split(a, ",")
		if !slices.Contains(parts, typ) {
			continue
		}
		parts = slices.DeleteFunc(parts, func(p string) bool { return p == typ })
		if len(parts) == 0 {
			return nil, false
		}
		out[i] = strings.Join(parts, ",")
		return out, true
	}
	return nil, false
}

// Errors of kubectl that mean the command as written is wrong, whatever the cluster holds.
var kubectlUsageErrors = []string{
	"unknown flag",
	"unknown shorthand flag",
	"unknown command",
	"flags cannot be placed before plugin name",
	"flag needs an argument",
	"invalid argument",
	"doesn't have a resource type",
	"context was not found",
	"You must specify the type of resource",
	"Required resource not specified",
	"for help and examples",
	"error parsing jsonpath",
	"unable to match a printer",
	"custom-columns spec",
	"unable to parse requirement",
	"couldn't parse the selector",
	"no matches for kind",
	"Error from server (BadRequest)",
	"Unable to connect to the server",
}

// Every kubectl command in the docs' shell blocks parses and names resource types the lab
// clusters serve (see the conventions at the top of this file).
func TestDocsKubectlCommands(t *testing.T) {
	l := startLab(t)
	calls, _ := docKubectlCalls(docFiles(t)) // problems: TestDocsBlocksAreWellFormed
	dir := t.TempDir()
	kubeconfig := writeDocsKubeconfig(t, l, dir)

	// The check itself: it catches what it must, and lets through errors about the data.
	for line, wantCaught := range map[string]bool{
		"kubectl get gii -A":                                                 true,
		"kubectl get gi --bogus":                                             true,
		"kubectl get gi -Z":                                                  true,
		"kubectl frobnicate gi":                                              true,
		"kubectl --context nowhere get gi":                                   true,
		"kubectl get gi -o jsonpath='{.status'":                              true,
		"kubectl get gi -o yamll":                                            true,
		"kubectl get gi -o custom-columns=NAME":                              true,
		"kubectl get gi -l 'a in (b'":                                        true,
		"kubectl get gi -n":                                                  true,
		"kubectl port-forward svc/x 8080 --bogus":                            true,
		"kubectl patch gwb x --typo=merge -p '{}'":                           true,
		"kubectl --context guest get gwb":                                    true, // guestnet's kinds are the host's
		"kubectl get gi -A":                                                  false,
		"kubectl describe gwb webhooks -n k0smotron":                         false,
		"kubectl --context guest get apiservice v1beta1.x":                   false,
		"kubectl --context guest top nodes":                                  false,
		"kubectl apply -f gi.yaml":                                           false,
		"kubectl patch gwb x -n y --type=merge -p '{}'":                      false,
		"kubectl logs -n guestnet-system deploy/guestnet-controller-manager": false,
		"kubectl port-forward -n guestnet-system svc/x 8443":                 false,
		"kubectl exec -n x deploy/y -- /manager --bogus":                     false,
		"kubectl get machines,vmi -A":                                        false, // vmi: KubeVirt's, not in the lab
		"kubectl get machinez,vmi -A":                                        true,
	} {
		cmds, err := parseShell([]string{line}, false)
		if err != nil {
			t.Fatal(err)
		}
		call, _ := kubectlInvocation(cmds[0].segments[0])
		call.pos = "self-check"
		_, mode, stderr, _ := checkKubectl(t, l, kubeconfig, dir, call)
		if caught := kubectlUsageError(stderr) != ""; caught != wantCaught {
			t.Errorf("self-check: %s (%s): caught=%v, want %v: %s", line, mode, caught, wantCaught, strings.TrimSpace(stderr))
		}
	}

	ran := map[string]int{}
	for _, call := range calls {
		args, mode, stderr, timedOut := checkKubectl(t, l, kubeconfig, dir, call)
		ran[mode]++
		if bad := kubectlUsageError(stderr); bad != "" {
			t.Errorf("%s: kubectl %s\n  ran as: kubectl %s\n  %s", call.pos, strings.Join(call.args, " "),
				strings.Join(args, " "), strings.ReplaceAll(strings.TrimSpace(stderr), "\n", "\n  "))
		}
		switch {
		case timedOut:
			t.Logf("%s: kubectl %s (%s): still running after the timeout: it parsed", call.pos, strings.Join(args, " "), mode)
		case testing.Verbose():
			t.Logf("%s: kubectl %s (%s): %s", call.pos, strings.Join(args, " "), mode, firstLine(stderr))
		}
	}
	t.Logf("%d kubectl commands: %d run, %d with --dry-run=server, %d with --help", len(calls), ran["run"], ran["dry-run"], ran["help"])
}

// checkKubectl runs a call the way the test checks it (kubectlCheckArgs), without the
// resource types no lab cluster serves (docsResourcesNotInLab), and returns the arguments it
// ran last, how, kubectl's stderr and whether it was still running at the timeout.
func checkKubectl(t *testing.T, l *lab.Lab, kubeconfig, dir string, call kubectlCall) ([]string, string, string, bool) {
	t.Helper()
	args, mode := kubectlCheckArgs(call.args)
	stderr, timedOut := runKubectl(t, l, kubeconfig, dir, args, call.stdin)
	for m := noResourceTypeRE.FindStringSubmatch(stderr); m != nil; m = noResourceTypeRE.FindStringSubmatch(stderr) {
		why, ok := docsResourcesNotInLab[m[1]]
		if !ok {
			break
		}
		t.Logf("%s: resource type %q not checked: %s", call.pos, m[1], why)
		rest, left := withoutResourceType(args, m[1])
		if !left {
			return args, mode, "", false
		}
		args = rest
		stderr, timedOut = runKubectl(t, l, kubeconfig, dir, args, call.stdin)
	}
	return args, mode, stderr, timedOut
}

// kubectlCheckArgs returns the arguments the test runs kubectl with for a call, and how.
func kubectlCheckArgs(callArgs []string) ([]string, string) {
	mode := kubectlMode(callArgs)
	args := slices.Clone(callArgs)
	switch mode {
	case "dry-run":
		if !slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--dry-run") }) {
			args = append(args, "--dry-run=server")
		}
	case "help":
		// Before a "--": what follows it is the remote command's (exec, debug, run).
		if i := slices.Index(args, "--"); i >= 0 {
			args = slices.Insert(args, i, "--help")
		} else {
			args = append(args, "--help")
		}
	}
	return args, mode
}

// kubectlUsageError returns the usage error kubectl's stderr reports, or "".
func kubectlUsageError(stderr string) string {
	for _, bad := range kubectlUsageErrors {
		if strings.Contains(stderr, bad) {
			return bad
		}
	}
	return ""
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if s == "" {
		return "ok"
	}
	l, _, _ := strings.Cut(s, "\n")
	return l
}

// writeDocsKubeconfig writes a kubeconfig with the lab's two clusters: context "host"
// (current) and context "guest", as the docs use them.
func writeDocsKubeconfig(t *testing.T, l *lab.Lab, dir string) string {
	t.Helper()
	host, err := clientcmd.Load(l.Host.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	guest, err := clientcmd.Load(l.Guest.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range guest.Clusters {
		host.Clusters[k] = v
	}
	for k, v := range guest.AuthInfos {
		host.AuthInfos[k] = v
	}
	for k, v := range guest.Contexts {
		host.Contexts[k] = v
	}
	if _, ok := host.Contexts["host"]; !ok {
		t.Fatal("the host kubeconfig has no context host")
	}
	if _, ok := host.Contexts["guest"]; !ok {
		t.Fatal("the guest kubeconfig has no context guest")
	}
	host.CurrentContext = "host"
	path := filepath.Join(dir, "kubeconfig")
	if err := clientcmd.WriteToFile(*host, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// runKubectl runs the lab's kubectl with the docs kubeconfig (through KUBECONFIG, not
// --kubeconfig: a flag before an unknown subcommand hides the "unknown command" error behind a
// plugin error). It returns stderr, and whether it was stopped after the timeout (a watch).
func runKubectl(t *testing.T, l *lab.Lab, kubeconfig, dir string, args []string, stdin string) (string, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, l.Assets.Kubectl, args...)
	cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + dir,
		"KUBECONFIG=" + kubeconfig,
		"KUBECACHEDIR=" + filepath.Join(dir, "cache"),
		"EDITOR=true", "KUBE_EDITOR=true",
	}
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	if ctx.Err() != nil {
		return stderr.String(), true
	}
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		t.Fatalf("running kubectl: %v", err)
	}
	return stderr.String(), false
}

// --- links -----------------------------------------------------------------------------

var (
	linkRE       = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	inlineCodeRE = regexp.MustCompile("`+[^`]*`+")
	headingRE    = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)
	htmlAnchorRE = regexp.MustCompile(`<a\s+(?:id|name)="([^"]+)"`)
)

// Relative links of the docs point at files that exist, and their #anchors at headings of
// the target page (GitHub's anchors). No cluster needed.
func TestDocsLinks(t *testing.T) {
	root, err := lab.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	files := docFiles(t)
	anchors := map[string]map[string]bool{}
	for _, f := range files {
		anchors[f.path] = headingAnchors(f)
	}
	checked := 0
	for _, f := range files {
		for _, n := range sortedKeys(f.prose) {
			text := inlineCodeRE.ReplaceAllString(f.prose[n], "")
			for _, m := range linkRE.FindAllStringSubmatch(text, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				checked++
				path, anchor, _ := strings.Cut(target, "#")
				rel := f.path
				if path != "" {
					rel = filepath.Clean(filepath.Join(filepath.Dir(f.path), path))
					if strings.HasPrefix(rel, "..") {
						t.Errorf("%s:%d: link %s leaves the repository", f.path, n, target)
						continue
					}
					if _, err := os.Stat(filepath.Join(root, rel)); err != nil {
						t.Errorf("%s:%d: link %s: %s does not exist", f.path, n, target, rel)
						continue
					}
				}
				if anchor == "" {
					continue
				}
				as, ok := anchors[rel]
				if !ok {
					continue // not a Markdown page of the docs (a source file: #L10 and the like)
				}
				if !as[anchor] {
					t.Errorf("%s:%d: link %s: %s has no heading with anchor #%s", f.path, n, target, rel, anchor)
				}
			}
		}
	}
	t.Logf("%d relative links checked", checked)
}

func sortedKeys(m map[int]string) []int {
	keys := make([]int, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// headingAnchors computes GitHub's anchors of a page: those of its headings (lower case,
// punctuation dropped but '-' and '_', spaces to '-', "-1", "-2" for repeats) and explicit
// <a id="..."> anchors.
func headingAnchors(f mdFile) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, n := range sortedKeys(f.prose) {
		for _, a := range htmlAnchorRE.FindAllStringSubmatch(f.prose[n], -1) {
			out[a[1]] = true // <a id="..."></a>
		}
		m := headingRE.FindStringSubmatch(f.prose[n])
		if m == nil {
			continue
		}
		var b strings.Builder
		for _, r := range strings.ToLower(m[1]) {
			switch {
			case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
				b.WriteRune(r)
			case r == ' ':
				b.WriteRune('-')
			}
		}
		a := b.String()
		if k := seen[a]; k > 0 {
			out[fmt.Sprintf("%s-%d", a, k)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

// --- RBAC -------------------------------------------------------------------------------

var backtickedRE = regexp.MustCompile("`([^`]*)`")

// docs/rbac.md lists every permission of the manager's ClusterRole (config/rbac/role.yaml,
// generated from the controllers' markers) and of the leader election Role, and nothing
// else: a new marker fails this test until the page says why it is needed. No cluster needed.
func TestDocsRBACListsEveryRule(t *testing.T) {
	root, err := lab.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	granted := map[string]map[string]bool{
		"ClusterRole guestnet-manager-role":  rbacPermissions(t, filepath.Join(root, "config", "rbac", "role.yaml"), "ClusterRole", ""),
		"Role guestnet-leader-election-role": rbacPermissions(t, filepath.Join(root, "config", "rbac", "leader_election_role.yaml"), "Role", ""),
		// The admission's exemption (config/admission, the release's admission-policies.yaml).
		"ClusterRole guestnet-admission-exempt": rbacPermissions(t, filepath.Join(root, "config", "admission", "exemptions.yaml"), "ClusterRole", ""),
	}
	// The roles for tenants and operators (kustomize prefixes their names with guestnet-).
	for _, name := range []string{"tenant-edit", "tenant-view", "policy-view"} {
		granted["ClusterRole guestnet-"+name] = rbacPermissions(t, filepath.Join(root, "config", "rbac", "tenant_roles.yaml"), "ClusterRole", name)
	}
	data, err := os.ReadFile(filepath.Join(root, "docs", "rbac.md"))
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]map[string]int{}
	section := ""
	for n, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "## ") {
			section = ""
			for name := range granted {
				kind, role, _ := strings.Cut(name, " ")
				if strings.HasPrefix(line, "## "+kind+" `"+role+"`") {
					section = name
				}
			}
			continue
		}
		if section == "" || !strings.HasPrefix(line, "| `") {
			continue
		}
		cells := strings.Split(line, "|")
		if len(cells) < 4 {
			t.Errorf("docs/rbac.md:%d: a rule row needs API group, resources and verbs", n+1)
			continue
		}
		groups, resources, verbs := backticked(cells[1]), backticked(cells[2]), backticked(cells[3])
		if len(groups) == 0 || len(resources) == 0 || len(verbs) == 0 {
			t.Errorf("docs/rbac.md:%d: a rule row needs API group, resources and verbs in backticks", n+1)
			continue
		}
		group := strings.Trim(groups[0], `"`)
		if documented[section] == nil {
			documented[section] = map[string]int{}
		}
		for _, r := range resources {
			for _, v := range verbs {
				documented[section][group+" "+r+" "+v] = n + 1
			}
		}
	}
	for name, perms := range granted {
		for _, p := range slices.Sorted(maps.Keys(perms)) {
			if _, ok := documented[name][p]; !ok {
				t.Errorf("docs/rbac.md: %s grants %q (group resource verb) but the page does not list it and say why", name, p)
			}
		}
		for p, line := range documented[name] {
			if !perms[p] {
				t.Errorf("docs/rbac.md:%d: lists %q under %s, which the manifests do not grant", line, p, name)
			}
		}
		t.Logf("%s: %d permissions, all documented", name, len(perms))
	}
}

func backticked(s string) []string {
	var out []string
	for _, m := range backtickedRE.FindAllStringSubmatch(s, -1) {
		out = append(out, m[1])
	}
	return out
}

// rbacPermissions reads the rules of a Role or ClusterRole manifest as "group resource verb"
// (of the role called name, or of every role of that kind when name is "").
func rbacPermissions(t *testing.T, path, kind, name string) map[string]bool {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := lab.DecodeObjects(data)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	perms := map[string]bool{}
	for _, o := range objs {
		if o.GetKind() != kind || (name != "" && o.GetName() != name) {
			continue
		}
		role := &rbacv1.ClusterRole{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, role); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		for _, r := range role.Rules {
			for _, g := range r.APIGroups {
				for _, res := range r.Resources {
					for _, v := range r.Verbs {
						perms[g+" "+res+" "+v] = true
					}
				}
			}
		}
	}
	if len(perms) == 0 {
		t.Fatalf("%s: no %s rules", path, kind)
	}
	return perms
}

// --- the parsers themselves --------------------------------------------------------------

func TestDocsParsers(t *testing.T) {
	t.Run("shell", func(t *testing.T) {
		block := []string{
			"NS=k0smotron",
			"kubectl get gi -n $NS   # a comment",
			"$ kubectl get secret tenant-a-kubeconfig -n \"${NS}\" -o jsonpath='{.data.value}' | base64 -d > guest.kubeconfig",
			"kubectl --kubeconfig guest.kubeconfig get apiservice v1beta1.metrics.k8s.io",
			"kubectl patch x --type=json -p '[",
			"  {\"op\": \"remove\"}]' && kubectl get <kind> 2>&1",
			"KUBECONFIG=g kubectl apply -f - <<'EOF'",
			"apiVersion: v1",
			"EOF",
			"kubectl get pods \\",
			"  -A",
			"helm template x | kubectl apply -f -",
		}
		calls, problems := docKubectlCalls([]mdFile{{path: "x.md", blocks: []mdBlock{{file: "x.md", line: 1, lang: "sh", lines: block}}}})
		if len(problems) > 0 {
			t.Fatal(problems)
		}
		var got []string
		for _, c := range calls {
			got = append(got, c.pos+" "+strings.Join(c.args, " ")+"|"+c.stdin)
		}
		want := []string{
			"x.md:3 get gi -n k0smotron|",
			"x.md:4 get secret tenant-a-kubeconfig -n k0smotron -o jsonpath={.data.value}|",
			"x.md:5 --context guest get apiservice v1beta1.metrics.k8s.io|",
			"x.md:6 patch x --type=json -p [\n  {\"op\": \"remove\"}]|",
			"x.md:6 get <kind>|",
			"x.md:8 --context guest apply -f -|apiVersion: v1\n",
			"x.md:11 get pods -A|",
			"x.md:13 apply -f -|",
		}
		if !slices.Equal(got, want) {
			t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		prompt, err := parseShell([]string{"$ kubectl get gi", "NAME   CLUSTER", "kubectl is not a command here"}, true)
		if err != nil || len(prompt) != 1 {
			t.Errorf("prompt block: %v %v", prompt, err)
		}
	})
	t.Run("modes", func(t *testing.T) {
		for args, want := range map[string]string{
			"get gi -A":                        "run",
			"--context guest get apiservice x": "run",
			"-n x describe gwb y":              "run",
			"patch gwb x --type=merge -p {}":   "dry-run",
			"delete svc -A -l a=b":             "dry-run",
			"rollout restart deploy/x":         "dry-run",
			"rollout status deploy/x":          "run",
			"port-forward svc/x 8080":          "help",
			"config use-context guest":         "help",
			"create token x":                   "help",
		} {
			if got := kubectlMode(strings.Fields(args)); got != want {
				t.Errorf("kubectl %s: %s, want %s", args, got, want)
			}
		}
	})
	t.Run("markdown", func(t *testing.T) {
		f, err := parseMarkdown("x.md", strings.Join([]string{
			"# Title: with `code`",
			"<!-- not-a-manifest: an excerpt -->",
			"",
			"```yaml",
			"kind: A",
			"```",
			"<!-- apply-to: guest -->",
			"- item",
			"  ```sh",
			"  kubectl get x",
			"  ```",
			"## Title: with `code`",
		}, "\n"))
		if err != nil {
			t.Fatal(err)
		}
		if len(f.blocks) != 2 || f.blocks[0].markers["not-a-manifest"] != "an excerpt" || f.blocks[0].line != 4 ||
			f.blocks[1].lang != "sh" || f.blocks[1].lines[0] != "kubectl get x" || len(f.blocks[1].markers) != 0 {
			t.Errorf("blocks: %+v", f.blocks)
		}
		if a := headingAnchors(f); !a["title-with-code"] || !a["title-with-code-1"] {
			t.Errorf("anchors: %v", a)
		}
		_, problems := blockManifests(mdBlock{file: "x.md", line: 1, lang: "yaml", lines: []string{"kind: Service", "metadata: {name: x}"}})
		if len(problems) != 1 {
			t.Errorf("kind without apiVersion: %v", problems)
		}
		_, problems = blockManifests(mdBlock{file: "x.md", line: 1, lang: "yaml", lines: []string{"apiVersion: v1", "kind: Service", "metadata: {name: x}"}})
		if len(problems) != 1 || !strings.Contains(problems[0], "apply-to") {
			t.Errorf("Service without apply-to: %v", problems)
		}
		_, problems = blockManifests(mdBlock{file: "x.md", line: 1, lang: "yaml", lines: []string{"apiVersion: example.com/v1", "kind: Unknown", "metadata: {name: x}"}})
		if len(problems) != 1 || !strings.Contains(problems[0], "docsKinds") {
			t.Errorf("unknown kind: %v", problems)
		}
	})
}

// The GuestWebhookBridge page names, for each invariant, the tests that hold it: each must be
// a test function of the repository. Every reason the bridge's API declares is documented
// on that page and in the API reference. No cluster needed.
func TestDocsBridgeInvariantsAndReasons(t *testing.T) {
	root, err := lab.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	page, err := os.ReadFile(filepath.Join(root, "docs", "guestwebhookbridge.md"))
	if err != nil {
		t.Fatal(err)
	}
	start := bytes.Index(page, []byte("\n## Invariants\n"))
	if start < 0 {
		t.Fatal("docs/guestwebhookbridge.md has no section Invariants")
	}
	section := string(page)[start+1:]
	if end := strings.Index(section[3:], "\n## "); end >= 0 {
		section = section[:end+3]
	}
	tests := map[string]bool{}
	err = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range regexp.MustCompile(`(?m)^func (Test\w+)\(`).FindAllStringSubmatch(string(data), -1) {
			tests[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	named := regexp.MustCompile("`(Test\\w+)`").FindAllStringSubmatch(section, -1)
	if len(named) < 10 {
		t.Errorf("the Invariants section names only %d tests", len(named))
	}
	for _, m := range named {
		if !tests[m[1]] {
			t.Errorf("docs/guestwebhookbridge.md, Invariants: %s is not a test function of the repository", m[1])
		}
	}

	types, err := os.ReadFile(filepath.Join(root, "api", "v1alpha1", "guestwebhookbridge_types.go"))
	if err != nil {
		t.Fatal(err)
	}
	apiRef, err := os.ReadFile(filepath.Join(root, "docs", "api.md"))
	if err != nil {
		t.Fatal(err)
	}
	reasons := regexp.MustCompile(`(?m)^\s+\w+Reason\s+=\s+"(\w+)"`).FindAllStringSubmatch(string(types), -1)
	if len(reasons) < 10 {
		t.Fatalf("found only %d reasons in guestwebhookbridge_types.go", len(reasons))
	}
	for _, m := range reasons {
		for name, doc := range map[string][]byte{"docs/guestwebhookbridge.md": page, "docs/api.md": apiRef} {
			if !strings.Contains(string(doc), "`"+m[1]+"`") {
				t.Errorf("%s does not document the reason %s", name, m[1])
			}
		}
	}
}
