package ports

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	kubevirtv1 "kubevirt.io/api/core/v1"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ssa"
)

// KubevirtMachineTemplateGVK is CAPK's worker template. CAPK's Go module cannot be imported
// next to guestnet's (it pins older CAPI and k8s libraries, see docs/lab.md): templates are
// handled as unstructured, and the embedded VM spec is decoded into KubeVirt's typed structs
// where that helps.
var KubevirtMachineTemplateGVK = schema.GroupVersionKind{
	Group: "infrastructure.cluster.x-k8s.io", Version: "v1alpha1", Kind: "KubevirtMachineTemplate",
}

// Paths inside a KubevirtMachineTemplate.
var (
	vmiSpecPath    = []string{"spec", "template", "spec", "virtualMachineTemplate", "spec", "template", "spec"}
	interfacesPath = append(slices.Clone(vmiSpecPath), "domain", "devices", "interfaces")
	networksPath   = append(slices.Clone(vmiSpecPath), "networks")
)

// TemplateState says how a worker template's pod network interface treats inbound ports.
type TemplateState string

const (
	// PortsDeclared means the masquerade interface lists every required port.
	PortsDeclared TemplateState = "PortsDeclared"
	// PortsMissing means the masquerade interface has a ports list that lacks required ports,
	// which never reach the VM (its virt-launcher pod refuses them).
	PortsMissing TemplateState = "PortsMissing"
	// AllPortsForwarded means the masquerade interface has no ports list: every port reaches the VM.
	AllPortsForwarded TemplateState = "AllPortsForwarded"
	// NotMasquerade means the pod network is not bound with masquerade (e.g. bridge binding), so
	// there is no ports list to keep.
	NotMasquerade TemplateState = "NotMasquerade"
)

// Analysis is what a worker template declares compared with what the cluster requires.
type Analysis struct {
	State TemplateState
	// Interface is the name of the pod network interface.
	Interface string
	// Declared are the ports the interface lists.
	Declared []Port
	// Missing are the required ports the interface lacks (State PortsMissing).
	Missing Set
}

// Analyze reads the pod network interface of a KubevirtMachineTemplate and compares its
// ports list with required.
func Analyze(tmpl *unstructured.Unstructured, required Set) (Analysis, error) {
	ifaces, index, err := podInterface(tmpl)
	if err != nil {
		return Analysis{}, err
	}
	if index < 0 {
		return Analysis{State: AllPortsForwarded}, nil
	}
	iface := ifaces[index]
	a := Analysis{Interface: iface.Name}
	switch {
	case iface.Masquerade == nil:
		a.State = NotMasquerade
	case len(iface.Ports) == 0:
		a.State = AllPortsForwarded
	default:
		for _, p := range iface.Ports {
			a.Declared = append(a.Declared, Port{Number: p.Port, Protocol: cmp.Or(corev1.Protocol(p.Protocol), corev1.ProtocolTCP)})
		}
		a.Missing = required.Missing(a.Declared)
		a.State = PortsDeclared
		if len(a.Missing) > 0 {
			a.State = PortsMissing
		}
	}
	return a, nil
}

// VMsElsewhere says where CAPK creates the VMs of tmpl's Machines when that is not the
// template's namespace (the Cluster's, where guestnet's host Services select the workers'
// virt-launcher pods), and "" when it is. CAPK (v0.11.2, KubevirtMachine controller) creates
// them in virtualMachineTemplate.metadata.namespace when set, and in the cluster of
// infraClusterSecretRef when set (this looks at the template's; a KubevirtCluster's is the
// default CAPK gives Machines without one).
func VMsElsewhere(tmpl *unstructured.Unstructured) string {
	if secret, _, _ := unstructured.NestedString(tmpl.Object, "spec", "template", "spec", "infraClusterSecretRef", "name"); secret != "" {
		return fmt.Sprintf("the infrastructure cluster of Secret %s (infraClusterSecretRef of KubevirtMachineTemplate %s)", secret, tmpl.GetName())
	}
	ns, _, _ := unstructured.NestedString(tmpl.Object, "spec", "template", "spec", "virtualMachineTemplate", "metadata", "namespace")
	if ns != "" && ns != tmpl.GetNamespace() {
		return fmt.Sprintf("namespace %s (virtualMachineTemplate.metadata.namespace of KubevirtMachineTemplate %s)", ns, tmpl.GetName())
	}
	return ""
}

// podInterface decodes the template's interfaces and returns them with the index of the one
// attached to the pod network (-1 when none is declared: KubeVirt then forwards everything).
func podInterface(tmpl *unstructured.Unstructured) ([]kubevirtv1.Interface, int, error) {
	var ifaces []kubevirtv1.Interface
	if err := decodeNested(tmpl, interfacesPath, &ifaces); err != nil {
		return nil, -1, err
	}
	var networks []kubevirtv1.Network
	if err := decodeNested(tmpl, networksPath, &networks); err != nil {
		return nil, -1, err
	}
	podNetwork := "default" // KubeVirt's pod network when none is listed
	for _, n := range networks {
		if n.Pod != nil {
			podNetwork = n.Name
		}
	}
	index := slices.IndexFunc(ifaces, func(i kubevirtv1.Interface) bool { return i.Name == podNetwork })
	return ifaces, index, nil
}

func decodeNested(u *unstructured.Unstructured, path []string, into any) error {
	raw, found, err := unstructured.NestedFieldNoCopy(u.Object, path...)
	if err != nil || !found {
		return err
	}
	data, err := json.Marshal(raw)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, into); err != nil {
		return fmt.Errorf("KubevirtMachineTemplate %s: %s: %w", u.GetName(), pathString(path), err)
	}
	return nil
}

func pathString(path []string) string {
	s := ""
	for _, p := range path {
		s += "." + p
	}
	return s
}

// hashLength is the number of hex digits of the content hash in generated template names.
const hashLength = 10

// BaseName is the name of the user's template that tmpl is, or was generated from.
func BaseName(tmpl metav1.Object) string {
	return cmp.Or(tmpl.GetAnnotations()[guestnetv1.BaseTemplateAnnotation], tmpl.GetName())
}

// Revision is the template revision tmpl was generated for ("" for a user's template).
func Revision(tmpl metav1.Object) string {
	return tmpl.GetAnnotations()[guestnetv1.TemplateRevisionAnnotation]
}

// Declare returns a new KubevirtMachineTemplate: a copy of tmpl whose pod network interface
// also lists the missing ports, named for cluster (GeneratedName) with a hash of its spec,
// the revision and the cluster, with tmpl's labels, annotations and owner references, marked
// as generated for cluster. The same content for the same cluster always gives the same
// name, so reconciling twice creates nothing new; two clusters never get the same name, so
// no cluster ever adopts, uses or deletes another's copy. tmpl itself is never changed: CAPK
// rejects in-place edits, and CAPI rolls workers only to a new name.
func Declare(tmpl *unstructured.Unstructured, missing Set, cluster, revision string) (*unstructured.Unstructured, error) {
	ifaces, index, err := podInterface(tmpl)
	if err != nil {
		return nil, err
	}
	if index < 0 || ifaces[index].Masquerade == nil {
		return nil, fmt.Errorf("KubevirtMachineTemplate %s has no masquerade pod interface to declare ports on", tmpl.GetName())
	}

	spec, _, err := unstructured.NestedMap(tmpl.Object, "spec")
	if err != nil {
		return nil, err
	}
	out := &unstructured.Unstructured{Object: map[string]any{"spec": spec}}
	rawIfaces, _, err := unstructured.NestedSlice(out.Object, interfacesPath...)
	if err != nil {
		return nil, err
	}
	// Keep every existing entry as it is (names, fields we do not know), append the missing.
	iface := rawIfaces[index].(map[string]any)
	ports, _ := iface["ports"].([]any)
	for _, r := range missing {
		ports = append(ports, map[string]any{"port": int64(r.Number), "protocol": string(r.Protocol)})
	}
	iface["ports"] = ports
	if err := unstructured.SetNestedSlice(out.Object, rawIfaces, interfacesPath...); err != nil {
		return nil, err
	}

	base := BaseName(tmpl)
	hash, err := contentHash(out.Object["spec"], revision, cluster)
	if err != nil {
		return nil, err
	}
	out.SetGroupVersionKind(KubevirtMachineTemplateGVK)
	out.SetNamespace(tmpl.GetNamespace())
	out.SetName(GeneratedName(base, cluster, hash))
	out.SetOwnerReferences(tmpl.GetOwnerReferences())
	labels := maps.Clone(tmpl.GetLabels())
	if labels == nil {
		labels = map[string]string{}
	}
	labels[guestnetv1.GeneratedTemplateLabel] = cluster
	out.SetLabels(labels)
	annotations := maps.Clone(tmpl.GetAnnotations())
	if annotations == nil {
		annotations = map[string]string{}
	}
	delete(annotations, corev1.LastAppliedConfigAnnotation)
	annotations[guestnetv1.BaseTemplateAnnotation] = base
	annotations[guestnetv1.TemplateRevisionAnnotation] = revision
	out.SetAnnotations(annotations)
	return out, nil
}

// maxNameLength is the longest object name (a DNS subdomain).
const maxNameLength = 253

// GeneratedName names the copy of base guestnet generates for cluster: <base>-<hash> when
// base already starts with "<cluster>-" (the usual <cluster>-md-0), <base>-<cluster>-<hash>
// otherwise, so the name always shows the Cluster. The hash covers the cluster name too, so
// two clusters never produce the same name, however their names and bases combine. base is
// shortened when the name would exceed 253 characters.
func GeneratedName(base, cluster, hash string) string {
	suffix := "-" + hash
	if !strings.HasPrefix(base, cluster+"-") {
		suffix = "-" + cluster + suffix
	}
	if len(base)+len(suffix) > maxNameLength {
		// A DNS subdomain's labels end with an alphanumeric character.
		base = strings.TrimRight(base[:maxNameLength-len(suffix)], "-.")
	}
	return base + suffix
}

func contentHash(spec any, revision, cluster string) (string, error) {
	// encoding/json sorts map keys: the same content always gives the same bytes.
	data, err := json.Marshal(spec)
	if err != nil {
		return "", err
	}
	sum := sha256.New()
	sum.Write(data)
	sum.Write([]byte{0})
	sum.Write([]byte(revision))
	sum.Write([]byte{0})
	sum.Write([]byte(cluster))
	return hex.EncodeToString(sum.Sum(nil))[:hashLength], nil
}

// Adoptable says whether existing, found under the name of the copy desired (from Declare),
// is that copy as guestnet wrote it for cluster: labelled as generated for cluster, with
// desired's spec. Fields the API server defaulted into existing are allowed; any other
// difference is not. A nil error means guestnet may use it; the error says why not.
func Adoptable(existing, desired *unstructured.Unstructured, cluster string) error {
	if owner := existing.GetLabels()[guestnetv1.GeneratedTemplateLabel]; owner != cluster {
		if owner == "" {
			return fmt.Errorf("KubevirtMachineTemplate %s already exists and guestnet did not generate it (no label %s=%s)",
				existing.GetName(), guestnetv1.GeneratedTemplateLabel, cluster)
		}
		return fmt.Errorf("KubevirtMachineTemplate %s already exists and is labelled %s=%s, not %s",
			existing.GetName(), guestnetv1.GeneratedTemplateLabel, owner, cluster)
	}
	same, err := containedIn(desired.Object["spec"], existing.Object["spec"])
	if err != nil {
		return err
	}
	if !same {
		return fmt.Errorf("KubevirtMachineTemplate %s already exists with another spec than the copy guestnet would write", existing.GetName())
	}
	return nil
}

// containedIn reports whether every field of want is in got with the same value
// (ssa.Subset: got may have more map keys; lists must have the same length). Both are
// compared as JSON, so 22 and 22.0 are equal.
func containedIn(want, got any) (bool, error) {
	normalize := func(v any) (any, error) {
		data, err := json.Marshal(v)
		if err != nil {
			return nil, err
		}
		var out any
		return out, json.Unmarshal(data, &out)
	}
	w, err := normalize(want)
	if err != nil {
		return false, err
	}
	g, err := normalize(got)
	if err != nil {
		return false, err
	}
	return ssa.Subset(w, g), nil
}

// PodInterfacePorts renders the ports list of tmpl's pod network interface as JSON (which
// YAML reads as it is), e.g. [{"port":22},{"port":8473,"protocol":"UDP"}]: for the copy
// guestnet would write, it is exactly the list to declare in the template's source.
func PodInterfacePorts(tmpl *unstructured.Unstructured) (iface, ports string, err error) {
	_, index, err := podInterface(tmpl)
	if err != nil || index < 0 {
		return "", "", err
	}
	rawIfaces, _, err := unstructured.NestedSlice(tmpl.Object, interfacesPath...)
	if err != nil {
		return "", "", err
	}
	entry, _ := rawIfaces[index].(map[string]any)
	name, _ := entry["name"].(string)
	data, err := json.Marshal(entry["ports"])
	return name, string(data), err
}
