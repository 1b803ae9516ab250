package lab

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// k0smotron, played. Nothing of k0smotron runs in the lab (the Go module proxy refuses its
// module, and no package ships its CRDs), but the real CAPI reads and clones its objects: a
// Cluster's control plane (K0smotronControlPlane, capi.go), and for a ClusterClass the
// control plane template and the workers' bootstrap config template, whose clones (a
// K0sWorkerConfig per Machine) the MachineSet controller creates. Their CRDs are stand-ins:
// any spec and status, labelled for contract v1beta1 (k0smotron's v1beta1 API) so that CAPI
// finds the version of a reference by them, as clusterctl installs k0smotron's.
// K0smotronStandIn then reports the control planes CAPI's topology controller creates as
// k0smotron reports a running hosted control plane. Bootstrap data is not played: Machines
// wait for it, as they wait for their VMs.

// The stand-in kinds of k0smotron besides K0smotronControlPlane (controlPlaneGVK, capi.go).
var (
	ControlPlaneTemplateGVK = schema.GroupVersionKind{Group: "controlplane.cluster.x-k8s.io", Version: "v1beta1", Kind: "K0smotronControlPlaneTemplate"}
	WorkerConfigTemplateGVK = schema.GroupVersionKind{Group: "bootstrap.cluster.x-k8s.io", Version: "v1beta1", Kind: "K0sWorkerConfigTemplate"}
	workerConfigGVK         = schema.GroupVersionKind{Group: "bootstrap.cluster.x-k8s.io", Version: "v1beta1", Kind: "K0sWorkerConfig"}
)

// ControlPlaneGVK is the kind of the lab's stand-in for k0smotron's control plane.
var ControlPlaneGVK = controlPlaneGVK

// installK0smotronTemplateCRDs installs the stand-in CRDs of k0smotron's template kinds and
// of the bootstrap config the workers' template is cloned into.
func (l *Lab) installK0smotronTemplateCRDs() error {
	var crds []*apiextensionsv1.CustomResourceDefinition
	for _, gvk := range []schema.GroupVersionKind{ControlPlaneTemplateGVK, WorkerConfigTemplateGVK, workerConfigGVK} {
		crds = append(crds, standInCRD(gvk))
	}
	_, err := envtest.InstallCRDs(l.Host.Config, envtest.CRDInstallOptions{
		CRDs: crds, MaxTime: time.Minute, PollInterval: 100 * time.Millisecond,
	})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("installing the stand-in k0smotron CRDs: %w", err)
	}
	return nil
}

// standInCRD is a namespaced CRD of gvk that keeps any spec and status (status subresource),
// labelled for contract v1beta1.
func standInCRD(gvk schema.GroupVersionKind) *apiextensionsv1.CustomResourceDefinition {
	plural := strings.ToLower(gvk.Kind) + "s"
	preserve := &apiextensionsv1.JSONSchemaProps{Type: "object", XPreserveUnknownFields: ptr.To(true)}
	return &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{
			Name:   plural + "." + gvk.Group,
			Labels: map[string]string{"cluster.x-k8s.io/v1beta1": gvk.Version, "lab.guestnet.dev/stand-in": "true"},
		},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: gvk.Group,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Kind: gvk.Kind, ListKind: gvk.Kind + "List", Plural: plural, Singular: strings.ToLower(gvk.Kind)},
			Scope: apiextensionsv1.NamespaceScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
				Name: gvk.Version, Served: true, Storage: true,
				Schema:       &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: preserve},
				Subresources: &apiextensionsv1.CustomResourceSubresources{Status: &apiextensionsv1.CustomResourceSubresourceStatus{}},
			}},
		},
	}
}

// K0smotronStandIn reports the K0smotronControlPlanes of one namespace as k0smotron reports a
// running hosted control plane (see its controller). Stop it with Stop (the lab stops it too).
type K0smotronStandIn struct {
	*standIn
	once sync.Once
}

// StartK0smotronStandIn starts the k0smotron stand-in for namespace ns (log
// <lab>/k0smotron-stand-in-<ns>.log). StartCAPI must have run (it installs the CRDs).
func (l *Lab) StartK0smotronStandIn(ctx context.Context, ns string) (*K0smotronStandIn, error) {
	s, err := startStandIn(ctx, l, "k0smotron-stand-in-"+ns, l.Host.Config, func(mgr ctrl.Manager, log logr.Logger) (func(), error) {
		cp := newUnstructured(controlPlaneGVK)
		var kubeconfig []byte
		if l.Guest != nil {
			kubeconfig = l.Guest.Kubeconfig
		}
		return func() {}, ctrl.NewControllerManagedBy(mgr).Named("k0smotron-controlplane-" + ns).For(cp).
			Complete(&controlPlaneStandIn{c: mgr.GetClient(), ns: ns, kubeconfig: kubeconfig, log: log})
	})
	if err != nil {
		return nil, err
	}
	k := &K0smotronStandIn{standIn: s}
	l.onStop(k.Stop)
	return k, nil
}

// Stop stops the stand-in; what it wrote stays.
func (k *K0smotronStandIn) Stop() { k.once.Do(k.standIn.Stop) }

// controlPlaneStandIn plays k0smotron's control plane controller for what CAPI reads
// (contract v1beta1): the hosted control plane is initialized, ready and externally managed
// (its apiserver is pods of the host, not Machines), at spec.version, with spec.replicas
// replicas all ready, up to date and available. CAPI's topology controller creates the
// workers' MachineDeployments only once the control plane is so (not provisioning, not
// upgrading, not scaling). Its apiserver is the lab's guest (every Cluster's): its
// spec.controlPlaneEndpoint and the <cluster>-kubeconfig Secret k0smotron writes point at it,
// so CAPI's (and guestnet's) connection to the workload cluster works.
type controlPlaneStandIn struct {
	c          client.Client
	ns         string
	kubeconfig []byte
	log        logr.Logger
}

func (r *controlPlaneStandIn) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	if req.Namespace != r.ns {
		return ctrl.Result{}, nil
	}
	cp := newUnstructured(controlPlaneGVK)
	if err := r.c.Get(ctx, req.NamespacedName, cp); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	version, _, _ := unstructured.NestedString(cp.Object, "spec", "version")
	replicas, found, _ := unstructured.NestedInt64(cp.Object, "spec", "replicas")
	if !found {
		replicas = 1
	}
	status := map[string]any{
		"initialized": true, "ready": true, "externalManagedControlPlane": true,
		"replicas": replicas, "readyReplicas": replicas, "updatedReplicas": replicas, "unavailableReplicas": int64(0),
	}
	if version != "" {
		status["version"] = version
	}
	if _, found, _ := unstructured.NestedMap(cp.Object, "spec", "controlPlaneEndpoint"); !found && r.kubeconfig != nil {
		// As a control plane provider reports its endpoint (contract: spec.controlPlaneEndpoint,
		// which CAPI copies into the Cluster's; internal/contract/controlplane.go in
		// sigs.k8s.io/cluster-api v1.14.2): the lab's guest apiserver.
		endpoint := GuestControlPlaneEndpoint()
		if err := unstructured.SetNestedMap(cp.Object, map[string]any{"host": endpoint.Host, "port": int64(endpoint.Port)}, "spec", "controlPlaneEndpoint"); err != nil {
			return ctrl.Result{}, err
		}
		r.log.Info("control plane endpoint", "controlPlane", req.NamespacedName.String(), "endpoint", endpoint.String())
		return ctrl.Result{}, r.c.Update(ctx, cp) // the update brings the object back
	}
	if cluster := cp.GetLabels()[clusterv1.ClusterNameLabel]; cluster != "" && r.kubeconfig != nil {
		secret := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: cp.GetNamespace(), Name: cluster + "-kubeconfig", Labels: map[string]string{clusterv1.ClusterNameLabel: cluster}},
			Type:       clusterv1.ClusterSecretType,
			Data:       map[string][]byte{"value": r.kubeconfig},
		}
		if err := r.c.Create(ctx, secret); client.IgnoreAlreadyExists(err) != nil {
			return ctrl.Result{}, err
		}
	}
	if current, _, _ := unstructured.NestedMap(cp.Object, "status"); equality.Semantic.DeepEqual(current, status) {
		return ctrl.Result{}, nil
	}
	cp.Object["status"] = status
	r.log.Info("control plane running", "controlPlane", req.NamespacedName.String(), "version", version, "replicas", replicas)
	return ctrl.Result{}, r.c.Status().Update(ctx, cp)
}
