package guestcache

import (
	"fmt"
	"strings"
	"sync"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
)

// builtinKind is a kind every supported Kubernetes version serves the same way, so that its
// REST mapping needs no discovery.
type builtinKind struct {
	gvk        schema.GroupVersionKind
	resource   string
	namespaced bool
}

// builtinKinds are the kinds guestnet reads or writes in a guest (and their neighbours in
// the same groups that it may read in diagnose): all GA since Kubernetes 1.22 at the latest,
// served at these versions by every release Cluster API supports. A kind not listed here is
// not refused: guestMapper looks up its group-version in that guest's discovery when it is
// first used.
var builtinKinds = []builtinKind{
	{corev1.SchemeGroupVersion.WithKind("Service"), "services", true},
	{corev1.SchemeGroupVersion.WithKind("Endpoints"), "endpoints", true},
	{corev1.SchemeGroupVersion.WithKind("Node"), "nodes", false},
	{corev1.SchemeGroupVersion.WithKind("Pod"), "pods", true},
	{corev1.SchemeGroupVersion.WithKind("ConfigMap"), "configmaps", true},
	{corev1.SchemeGroupVersion.WithKind("Secret"), "secrets", true},
	{corev1.SchemeGroupVersion.WithKind("Namespace"), "namespaces", false},
	{corev1.SchemeGroupVersion.WithKind("ServiceAccount"), "serviceaccounts", true},
	{corev1.SchemeGroupVersion.WithKind("Event"), "events", true},
	{discoveryv1.SchemeGroupVersion.WithKind("EndpointSlice"), "endpointslices", true},
	{admissionregistrationv1.SchemeGroupVersion.WithKind("ValidatingWebhookConfiguration"), "validatingwebhookconfigurations", false},
	{admissionregistrationv1.SchemeGroupVersion.WithKind("MutatingWebhookConfiguration"), "mutatingwebhookconfigurations", false},
	{apiregistrationv1.SchemeGroupVersion.WithKind("APIService"), "apiservices", false},
	{appsv1.SchemeGroupVersion.WithKind("DaemonSet"), "daemonsets", true},
	{appsv1.SchemeGroupVersion.WithKind("Deployment"), "deployments", true},
	{rbacv1.SchemeGroupVersion.WithKind("ClusterRole"), "clusterroles", false},
	{rbacv1.SchemeGroupVersion.WithKind("ClusterRoleBinding"), "clusterrolebindings", false},
	{rbacv1.SchemeGroupVersion.WithKind("Role"), "roles", true},
	{rbacv1.SchemeGroupVersion.WithKind("RoleBinding"), "rolebindings", true},
	{coordinationv1.SchemeGroupVersion.WithKind("Lease"), "leases", true},
}

// BuiltinMappings returns the REST mappings guestnet knows without asking a guest (a lab test
// compares them with a real apiserver's discovery).
func BuiltinMappings() []*meta.RESTMapping {
	out := make([]*meta.RESTMapping, 0, len(builtinKinds))
	for _, k := range builtinKinds {
		m, err := builtinMapper.RESTMapping(k.gvk.GroupKind(), k.gvk.Version)
		if err != nil {
			panic(err) // builtinMapper holds every builtinKind
		}
		out = append(out, m)
	}
	return out
}

// builtinMapper maps builtinKinds, for every guest: built once per process.
var builtinMapper = func() meta.RESTMapper {
	var gvs []schema.GroupVersion
	for _, k := range builtinKinds {
		gvs = append(gvs, k.gvk.GroupVersion())
	}
	m := meta.NewDefaultRESTMapper(gvs)
	for _, k := range builtinKinds {
		scope := meta.RESTScopeRoot
		if k.namespaced {
			scope = meta.RESTScopeNamespace
		}
		m.AddSpecific(k.gvk, k.gvk.GroupVersion().WithResource(k.resource), k.gvk.GroupVersion().WithResource(k.resource[:len(k.resource)-1]), scope)
	}
	return m
}()

// guestMapper is the REST mapper of one guest: builtinMapper first, then the kinds of the
// group-versions it looked up in that guest's discovery, one group-version at a time, when a
// kind outside builtinKinds was first asked for (e.g. cilium.io/v2 CiliumNode). CAPI's
// ClusterCache instead fills a mapper per guest from the guest's whole aggregated discovery
// when it connects: every group and resource the guest serves, about 0.4 MiB per guest,
// of which guestnet uses a dozen kinds (docs/decisions/0013-guest-connections.md).
type guestMapper struct {
	discovery discovery.DiscoveryInterface

	mu      sync.RWMutex
	learned *meta.DefaultRESTMapper
	// looked up are the group-versions asked of discovery (found or not).
	lookedUp map[schema.GroupVersion]bool
}

var _ meta.RESTMapper = &guestMapper{}

func newGuestMapper(d discovery.DiscoveryInterface) *guestMapper {
	return &guestMapper{discovery: d, learned: meta.NewDefaultRESTMapper(nil), lookedUp: map[schema.GroupVersion]bool{}}
}

// mappers returns builtinMapper and what this guest's discovery added.
func (m *guestMapper) mappers() meta.MultiRESTMapper {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return meta.MultiRESTMapper{builtinMapper, m.learned}
}

// lookUp adds the resources of gv that this guest serves, once per group-version.
func (m *guestMapper) lookUp(gv schema.GroupVersion) error {
	m.mu.RLock()
	done := m.lookedUp[gv]
	m.mu.RUnlock()
	if done || gv.Version == "" {
		return nil
	}
	resources, err := m.discovery.ServerResourcesForGroupVersion(gv.String())
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("looking up %s in the guest's discovery: %w", gv, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lookedUp[gv] = true
	if resources == nil {
		return nil
	}
	for _, r := range resources.APIResources {
		if r.Kind == "" || strings.Contains(r.Name, "/") {
			continue // subresources
		}
		scope := meta.RESTScopeRoot
		if r.Namespaced {
			scope = meta.RESTScopeNamespace
		}
		singular := r.SingularName
		if singular == "" {
			singular = r.Name
		}
		m.learned.AddSpecific(gv.WithKind(r.Kind), gv.WithResource(r.Name), gv.WithResource(singular), scope)
	}
	return nil
}

// retry runs f on the mappers; when they know no match and versions names the
// group-version, it looks that up and runs f again.
func retry[T any](m *guestMapper, group string, versions []string, f func(meta.RESTMapper) (T, error)) (T, error) {
	res, err := f(m.mappers())
	if !meta.IsNoMatchError(err) {
		return res, err
	}
	looked := false
	for _, v := range versions {
		if v == "" {
			continue
		}
		if lookErr := m.lookUp(schema.GroupVersion{Group: group, Version: v}); lookErr != nil {
			return res, lookErr
		}
		looked = true
	}
	if !looked {
		return res, err
	}
	return f(m.mappers())
}

func (m *guestMapper) RESTMapping(gk schema.GroupKind, versions ...string) (*meta.RESTMapping, error) {
	return retry(m, gk.Group, versions, func(r meta.RESTMapper) (*meta.RESTMapping, error) { return r.RESTMapping(gk, versions...) })
}

func (m *guestMapper) RESTMappings(gk schema.GroupKind, versions ...string) ([]*meta.RESTMapping, error) {
	return retry(m, gk.Group, versions, func(r meta.RESTMapper) ([]*meta.RESTMapping, error) { return r.RESTMappings(gk, versions...) })
}

func (m *guestMapper) KindFor(resource schema.GroupVersionResource) (schema.GroupVersionKind, error) {
	return retry(m, resource.Group, []string{resource.Version}, func(r meta.RESTMapper) (schema.GroupVersionKind, error) { return r.KindFor(resource) })
}

func (m *guestMapper) KindsFor(resource schema.GroupVersionResource) ([]schema.GroupVersionKind, error) {
	return retry(m, resource.Group, []string{resource.Version}, func(r meta.RESTMapper) ([]schema.GroupVersionKind, error) { return r.KindsFor(resource) })
}

func (m *guestMapper) ResourceFor(input schema.GroupVersionResource) (schema.GroupVersionResource, error) {
	return retry(m, input.Group, []string{input.Version}, func(r meta.RESTMapper) (schema.GroupVersionResource, error) { return r.ResourceFor(input) })
}

func (m *guestMapper) ResourcesFor(input schema.GroupVersionResource) ([]schema.GroupVersionResource, error) {
	return retry(m, input.Group, []string{input.Version}, func(r meta.RESTMapper) ([]schema.GroupVersionResource, error) { return r.ResourcesFor(input) })
}

func (m *guestMapper) ResourceSingularizer(resource string) (string, error) {
	return m.mappers().ResourceSingularizer(resource)
}
