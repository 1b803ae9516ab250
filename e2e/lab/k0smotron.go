package lab

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	discoveryv1ac "k8s.io/client-go/applyconfigurations/discovery/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
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
		return func() {}, ctrl.NewControllerManagedBy(mgr).Named("k0smotron-controlplane-"+ns).For(cp).
			Watches(&corev1.Service{}, handler.EnqueueRequestsFromMapFunc(controlPlaneOfService)).
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
//
// With spec.service.type LoadBalancer it plays k0smotron's LoadBalancer Service instead
// (reconcileLoadBalancer): the endpoint and the kubeconfig's server are the Service's
// load-balancer IP, and until the Service has one there is no endpoint, no Secret and no
// status (k0smotron starts the control plane only once it knows its external address).
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
	endpoint, kubeconfig := GuestControlPlaneEndpoint(), r.kubeconfig
	current, found, _ := unstructured.NestedMap(cp.Object, "spec", "controlPlaneEndpoint")
	setEndpoint := !found && r.kubeconfig != nil
	if serviceType, _, _ := unstructured.NestedString(cp.Object, "spec", "service", "type"); serviceType == string(corev1.ServiceTypeLoadBalancer) {
		ip, apiPort, err := r.reconcileLoadBalancer(ctx, cp)
		if err != nil {
			return ctrl.Result{}, err
		}
		if ip == "" {
			// k0smotron polls the Service every second (for up to 2 minutes per reconcile).
			return ctrl.Result{RequeueAfter: time.Second}, nil
		}
		endpoint = clusterv1.APIEndpoint{Host: ip, Port: apiPort}
		setEndpoint = !found || current["host"] != ip || current["port"] != int64(apiPort)
		if kubeconfig != nil {
			if kubeconfig, err = kubeconfigWithServer(kubeconfig, "https://"+endpoint.String()); err != nil {
				return ctrl.Result{}, err
			}
		}
	}
	if setEndpoint {
		// As a control plane provider reports its endpoint (contract: spec.controlPlaneEndpoint,
		// which CAPI copies into the Cluster's; internal/contract/controlplane.go in
		// sigs.k8s.io/cluster-api v1.14.2): the lab's guest apiserver, or the load-balancer IP
		// in front of it.
		if err := unstructured.SetNestedMap(cp.Object, map[string]any{"host": endpoint.Host, "port": int64(endpoint.Port)}, "spec", "controlPlaneEndpoint"); err != nil {
			return ctrl.Result{}, err
		}
		r.log.Info("control plane endpoint", "controlPlane", req.NamespacedName.String(), "endpoint", endpoint.String())
		return ctrl.Result{}, r.c.Update(ctx, cp) // the update brings the object back
	}
	if cluster := cp.GetLabels()[clusterv1.ClusterNameLabel]; cluster != "" && kubeconfig != nil {
		secret := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: cp.GetNamespace(), Name: cluster + "-kubeconfig", Labels: map[string]string{clusterv1.ClusterNameLabel: cluster}},
			Type:       clusterv1.ClusterSecretType,
			Data:       map[string][]byte{"value": kubeconfig},
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

// k0smotron's defaults of spec.service, and the field manager it applies the Service with.
const (
	k0smotronDefaultAPIPort          = 30443
	k0smotronDefaultKonnectivityPort = 30132
	k0smotronFieldManager            = "k0smotron"
	// k0smotronEndpointsManager writes the EndpointSlice that plays the kmc pods' endpoints.
	k0smotronEndpointsManager = "k0smotron-stand-in"
)

// ControlPlaneServiceName is the name of the LoadBalancer Service k0smotron makes for the
// K0smotronControlPlane named controlPlane whose spec.service.type is LoadBalancer.
func ControlPlaneServiceName(controlPlane string) string { return "kmc-" + controlPlane + "-lb" }

// reconcileLoadBalancer plays k0smotron's Service for a control plane of spec.service.type
// LoadBalancer: it server-side applies kmc-<name>-lb as k0smotron does (field manager
// k0smotron, forced; ports api and konnectivity, spec.service.loadBalancerClass and
// .annotations, owned by the control plane), so another field manager (guestnet) can own
// lbipam.cilium.io/ips on it. It returns the Service's load-balancer IP ("" until it has
// one) and the api port.
func (r *controlPlaneStandIn) reconcileLoadBalancer(ctx context.Context, cp *unstructured.Unstructured) (string, int32, error) {
	apiPort := servicePort(cp, "apiPort", k0smotronDefaultAPIPort)
	konnectivityPort := servicePort(cp, "konnectivityPort", k0smotronDefaultKonnectivityPort)
	name := ControlPlaneServiceName(cp.GetName())
	spec := corev1ac.ServiceSpec().WithType(corev1.ServiceTypeLoadBalancer).WithPorts(
		corev1ac.ServicePort().WithName("api").WithProtocol(corev1.ProtocolTCP).WithPort(apiPort).WithTargetPort(intstr.FromInt32(apiPort)),
		corev1ac.ServicePort().WithName("konnectivity").WithProtocol(corev1.ProtocolTCP).WithPort(konnectivityPort).WithTargetPort(intstr.FromInt32(konnectivityPort)),
	)
	if class, _, _ := unstructured.NestedString(cp.Object, "spec", "service", "loadBalancerClass"); class != "" {
		spec.WithLoadBalancerClass(class)
	}
	svc := corev1ac.Service(name, cp.GetNamespace()).WithSpec(spec).WithOwnerReferences(metav1ac.OwnerReference().
		WithAPIVersion(cp.GetAPIVersion()).WithKind(cp.GetKind()).WithName(cp.GetName()).WithUID(cp.GetUID()).
		WithController(true).WithBlockOwnerDeletion(true))
	if annotations, _, _ := unstructured.NestedStringMap(cp.Object, "spec", "service", "annotations"); len(annotations) > 0 {
		svc.WithAnnotations(annotations)
	}
	if err := r.c.Apply(ctx, svc, client.FieldOwner(k0smotronFieldManager), client.ForceOwnership); err != nil {
		return "", 0, fmt.Errorf("applying Service %s: %w", name, err)
	}
	// The lab's guest apiserver is no pod, so the Service has no selector: this EndpointSlice
	// plays the one the EndpointSlice controller keeps for the kmc pods (api and konnectivity
	// on the pod's address).
	slice := discoveryv1ac.EndpointSlice(name, cp.GetNamespace()).
		WithLabels(map[string]string{discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: k0smotronEndpointsManager}).
		WithOwnerReferences(metav1ac.OwnerReference().WithAPIVersion("v1").WithKind("Service").WithName(name).WithUID(ptr.Deref(svc.UID, "")).WithController(true)).
		WithAddressType(discoveryv1.AddressTypeIPv4).
		WithEndpoints(discoveryv1ac.Endpoint().WithAddresses(GuestAPIServerAddress).WithConditions(discoveryv1ac.EndpointConditions().WithReady(true))).
		WithPorts(
			discoveryv1ac.EndpointPort().WithName("api").WithProtocol(corev1.ProtocolTCP).WithPort(APIServerPort),
			discoveryv1ac.EndpointPort().WithName("konnectivity").WithProtocol(corev1.ProtocolTCP).WithPort(KonnectivityAgentPort),
		)
	if err := r.c.Apply(ctx, slice, client.FieldOwner(k0smotronEndpointsManager), client.ForceOwnership); err != nil {
		return "", 0, fmt.Errorf("applying EndpointSlice %s: %w", name, err)
	}
	ip := ""
	if svc.Status != nil && svc.Status.LoadBalancer != nil {
		for _, in := range svc.Status.LoadBalancer.Ingress {
			if ip = ptr.Deref(in.IP, ""); ip != "" {
				break
			}
		}
	}
	if ip == "" {
		r.log.Info("waiting for the control plane's load-balancer IP", "service", cp.GetNamespace()+"/"+name)
	}
	return ip, apiPort, nil
}

// servicePort is spec.service.<field> of a control plane, def when unset.
func servicePort(cp *unstructured.Unstructured, field string, def int32) int32 {
	if p, found, _ := unstructured.NestedInt64(cp.Object, "spec", "service", field); found && p > 0 {
		return int32(p)
	}
	return def
}

// controlPlaneOfService maps a control plane's Service to the control plane, so that its
// load-balancer IP is seen as soon as LB-IPAM writes it.
func controlPlaneOfService(_ context.Context, o client.Object) []reconcile.Request {
	for _, ref := range o.GetOwnerReferences() {
		if ref.Kind == controlPlaneGVK.Kind && ref.APIVersion == controlPlaneGVK.GroupVersion().String() {
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: ref.Name}}}
		}
	}
	return nil
}

// kubeconfigWithServer is kubeconfig with every cluster's server set to server.
func kubeconfigWithServer(kubeconfig []byte, server string) ([]byte, error) {
	cfg, err := clientcmd.Load(kubeconfig)
	if err != nil {
		return nil, err
	}
	for _, c := range cfg.Clusters {
		c.Server = server
	}
	return clientcmd.Write(*cfg)
}

// InstallK0smotronCRDs installs the stand-in CRDs of k0smotron's kinds (StartCAPI does too),
// for a test that writes them without Cluster API running.
func (l *Lab) InstallK0smotronCRDs() error {
	if err := l.installControlPlaneCRD(); err != nil {
		return err
	}
	return l.installK0smotronTemplateCRDs()
}
