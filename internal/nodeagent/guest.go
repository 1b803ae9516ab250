// Package nodeagent is guestnet's agent inside the guest cluster (docs/decisions/0011):
// `manager node-agent`, run by a DaemonSet guestnet applies into each guest that opts in to
// node identity, keeps the VM's kernel in step with its Node (the node IP, its virt-launcher
// pod IP, as a local address; KubeVirt's masquerade address 10.0.2.2 translated to it and back).
//
// This file is the contract between the manager's node-identity controller, which calls Apply
// and Delete with a guest client, and the agent's own code in this package: the objects the
// agent needs in the guest are made and written here, in one place.
package nodeagent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	appsv1ac "k8s.io/client-go/applyconfigurations/apps/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	rbacv1ac "k8s.io/client-go/applyconfigurations/rbac/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
)

// Names of the agent's objects in the guest.
const (
	// Namespace holds the agent (Pod Security "privileged": it runs on the host network with
	// NET_ADMIN).
	Namespace = "guestnet-system"
	// Name names its ServiceAccount, ClusterRole, ClusterRoleBinding and DaemonSet.
	Name = "guestnet-node-agent"
	// HealthPort is where the agent answers /readyz on 127.0.0.1 (the kubelet's readiness
	// probe) and /healthz on the node IP, which /readyz dials from inside the VM: a ready
	// agent proves that the node IP is an address of the VM. (127.0.0.1, not the pod IP the
	// kubelet would dial by default: during the opt-out the node IP is taken off on purpose.)
	HealthPort = 9441
	// TemplateHashAnnotation carries the hash of what guestnet applied, so that guestnet
	// applies again only when it would change something (no write at steady state).
	TemplateHashAnnotation = "guestnet.addons.cluster.x-k8s.io/node-agent-template"
	// NodeNameEnv is the agent's environment variable with its Node's name.
	NodeNameEnv = "NODE_NAME"
)

// Params are what the agent's guest objects are made from.
type Params struct {
	// Image is the manager's own image (the agent is its `node-agent` subcommand).
	Image string
	// APIServerHost and APIServerPort are where the agent reaches the guest apiserver from
	// inside a VM: the Cluster's spec.controlPlaneEndpoint, not the guest's ClusterIP (which
	// needs a working CNI and kube-proxy).
	APIServerHost string
	APIServerPort int32
	// Remove rolls the agents out with --remove: they take off what they put in the kernel
	// (the opt-out), and Status.RolledOut says when every one has.
	Remove bool
}

// Status is what the agent's DaemonSet reports.
type Status struct {
	// Desired, Updated and Ready count the agent pods (the DaemonSet's status for the
	// generation applied).
	Desired, Updated, Ready int32
	// RolledOut: every desired pod runs the applied template and is ready.
	RolledOut bool
}

// String renders s for condition messages.
func (s Status) String() string {
	return fmt.Sprintf("%d of %d agents ready, %d updated", s.Ready, s.Desired, s.Updated)
}

// Args are the agent's command-line arguments for p.
func Args(p Params) []string {
	args := []string{"node-agent", "--node-name=$(" + NodeNameEnv + ")", "--health-port=" + strconv.Itoa(HealthPort)}
	if p.Remove {
		args = append(args, "--remove")
	}
	return args
}

// objects are the agent's guest objects for p, in the order they are applied.
func objects(p Params) (*corev1ac.NamespaceApplyConfiguration, *corev1ac.ServiceAccountApplyConfiguration,
	*rbacv1ac.ClusterRoleApplyConfiguration, *rbacv1ac.ClusterRoleBindingApplyConfiguration, *appsv1ac.DaemonSetApplyConfiguration) {
	labels := map[string]string{"app.kubernetes.io/name": Name, ownership.ManagedByLabel: ownership.ManagedByValue}
	ns := corev1ac.Namespace(Namespace).WithLabels(map[string]string{
		ownership.ManagedByLabel:             ownership.ManagedByValue,
		"pod-security.kubernetes.io/enforce": "privileged",
	})
	sa := corev1ac.ServiceAccount(Name, Namespace).WithLabels(labels)
	// Read its own Node: nothing else, and no write anywhere (docs/node-identity.md, "The
	// agent's rights in the guest"). Nodes cannot be narrowed to one name by RBAC for a
	// DaemonSet's one ServiceAccount; list and watch are what a field-selected informer needs.
	role := rbacv1ac.ClusterRole(Name).WithLabels(labels).WithRules(
		rbacv1ac.PolicyRule().WithAPIGroups("").WithResources("nodes").WithVerbs("get", "list", "watch"))
	binding := rbacv1ac.ClusterRoleBinding(Name).WithLabels(labels).
		WithRoleRef(rbacv1ac.RoleRef().WithAPIGroup(rbacv1.GroupName).WithKind("ClusterRole").WithName(Name)).
		WithSubjects(rbacv1ac.Subject().WithKind(rbacv1.ServiceAccountKind).WithName(Name).WithNamespace(Namespace))

	container := corev1ac.Container().WithName("node-agent").WithImage(p.Image).
		WithArgs(Args(p)...).
		WithEnv(
			corev1ac.EnvVar().WithName(NodeNameEnv).WithValueFrom(corev1ac.EnvVarSource().WithFieldRef(
				corev1ac.ObjectFieldSelector().WithFieldPath("spec.nodeName"))),
			// In-cluster configuration reads these: the guest's kubernetes Service needs the
			// CNI and kube-proxy, the agent must work before them.
			corev1ac.EnvVar().WithName("KUBERNETES_SERVICE_HOST").WithValue(p.APIServerHost),
			corev1ac.EnvVar().WithName("KUBERNETES_SERVICE_PORT").WithValue(strconv.Itoa(int(p.APIServerPort))),
		).
		WithReadinessProbe(corev1ac.Probe().WithPeriodSeconds(10).WithHTTPGet(
			corev1ac.HTTPGetAction().WithHost("127.0.0.1").WithPath("/readyz").WithPort(intstr.FromInt32(HealthPort)))).
		WithResources(corev1ac.ResourceRequirements().
			WithRequests(corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("5m"), corev1.ResourceMemory: resource.MustParse("24Mi")}).
			WithLimits(corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")})).
		WithSecurityContext(corev1ac.SecurityContext().
			WithRunAsUser(0).WithRunAsNonRoot(false).
			WithAllowPrivilegeEscalation(false).WithReadOnlyRootFilesystem(true).
			WithCapabilities(corev1ac.Capabilities().WithDrop("ALL").WithAdd("NET_ADMIN")).
			WithSeccompProfile(corev1ac.SeccompProfile().WithType(corev1.SeccompProfileTypeRuntimeDefault)))

	podSpec := corev1ac.PodSpec().
		WithServiceAccountName(Name).
		WithHostNetwork(true).
		WithDNSPolicy(corev1.DNSClusterFirstWithHostNet).
		WithPriorityClassName("system-node-critical").
		WithTerminationGracePeriodSeconds(5).
		WithNodeSelector(map[string]string{corev1.LabelOSStable: "linux"}).
		// Before guestnet initializes a Node (the agent then waits for its address), and on
		// Nodes other taints keep workloads away from.
		WithTolerations(corev1ac.Toleration().WithOperator(corev1.TolerationOpExists)).
		WithContainers(container)
	ds := appsv1ac.DaemonSet(Name, Namespace).WithLabels(labels).
		WithSpec(appsv1ac.DaemonSetSpec().
			WithSelector(metav1ac.LabelSelector().WithMatchLabels(map[string]string{"app.kubernetes.io/name": Name})).
			WithUpdateStrategy(appsv1ac.DaemonSetUpdateStrategy().WithType(appsv1.RollingUpdateDaemonSetStrategyType).
				WithRollingUpdate(appsv1ac.RollingUpdateDaemonSet().WithMaxUnavailable(intstr.FromString("20%")))).
			WithTemplate(corev1ac.PodTemplateSpec().
				WithLabels(map[string]string{"app.kubernetes.io/name": Name}).
				WithSpec(podSpec)))
	return ns, sa, role, binding, ds
}

// DaemonSet is the agent's DaemonSet for p, as Apply applies it (without the hash annotation).
func DaemonSet(p Params) *appsv1ac.DaemonSetApplyConfiguration {
	_, _, _, _, ds := objects(p)
	return ds
}

// TemplateHash is the hash of the agent's objects for p.
func TemplateHash(p Params) string {
	ns, sa, role, binding, ds := objects(p)
	h := sha256.New()
	for _, o := range []any{ns, sa, role, binding, ds} {
		b, _ := json.Marshal(o)
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// Apply server-side applies the agent's objects into the guest (its namespace,
// ServiceAccount, read-only RBAC on nodes, DaemonSet) unless live, the agent's DaemonSet as
// read (nil when there is none), carries their hash already, and reports the DaemonSet's
// state. applied says whether it wrote.
func Apply(ctx context.Context, c client.Client, live *appsv1.DaemonSet, p Params) (st Status, applied bool, err error) {
	hash := TemplateHash(p)
	if live == nil || live.Annotations[TemplateHashAnnotation] != hash {
		ns, sa, role, binding, ds := objects(p)
		ds.WithAnnotations(map[string]string{TemplateHashAnnotation: hash})
		opts := []client.ApplyOption{client.FieldOwner(ownership.FieldManager), client.ForceOwnership}
		for _, o := range []runtime.ApplyConfiguration{ns, sa, role, binding, ds} {
			if err := c.Apply(ctx, o, opts...); err != nil {
				return Status{}, false, fmt.Errorf("applying the node agent's %T in the guest: %w", o, err)
			}
		}
		return Status{}, true, nil
	}
	return DaemonSetStatus(live), false, nil
}

// DaemonSetStatus reads the agent's rollout from its DaemonSet.
func DaemonSetStatus(ds *appsv1.DaemonSet) Status {
	s := ds.Status
	st := Status{Desired: s.DesiredNumberScheduled, Updated: s.UpdatedNumberScheduled, Ready: s.NumberReady}
	st.RolledOut = s.ObservedGeneration >= ds.Generation && s.UpdatedNumberScheduled == s.DesiredNumberScheduled &&
		s.NumberReady == s.DesiredNumberScheduled && s.NumberUnavailable == 0
	return st
}

// Delete deletes the agent's objects from the guest; gone is true once none is left but the
// namespace, whose deletion is issued and left to the guest's namespace controller (it waits
// for the pods). Call it only after a Remove rollout reported RolledOut, so that no VM keeps
// what an agent put in its kernel.
func Delete(ctx context.Context, c client.Client) (gone bool, err error) {
	gone = true
	for _, o := range []client.Object{
		&appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: Name}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: Name}},
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: Name}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: Name}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}},
	} {
		err := c.Delete(ctx, o, client.PropagationPolicy(metav1.DeletePropagationBackground))
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return false, fmt.Errorf("deleting the node agent's %T in the guest: %w", o, err)
		default:
			if _, isNamespace := o.(*corev1.Namespace); !isNamespace {
				gone = false
			}
		}
	}
	return gone, nil
}
