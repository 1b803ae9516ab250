package guestwebhookbridge

import (
	"context"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/clusterscope"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ports"
)

// readyConditions are the conditions Ready summarises. Those the controller does not report
// yet count as Unknown, so Ready cannot claim a bridge that does not exist.
var readyConditions = []string{
	guestnetv1.ClusterAvailableCondition,
	guestnetv1.TargetsBridgedCondition,
	guestnetv1.TargetsReachableCondition,
	guestnetv1.PortsDeclaredCondition,
}

// ownedConditions are all conditions this controller writes; the patch helper lets its
// values win over concurrent writers.
var ownedConditions = append([]string{guestnetv1.ReadyCondition, guestnetv1.PausedCondition}, readyConditions...)

// reconcileNormal bridges the selected targets once the guest cluster is reachable.
func (r *Reconciler) reconcileNormal(ctx context.Context, s *scope) (ctrl.Result, error) {
	guestClient, err := clusterscope.Connect(ctx, r.ClusterCache, s.bridge, s.cluster)
	if err != nil || guestClient == nil {
		// Not reachable yet: the Cluster watch or the ClusterCache connect event brings us back.
		return ctrl.Result{}, err
	}
	s.guestClient = guestClient

	// The workerports controller declares the ports; this object reports whether its own are.
	if err := ports.ReportPortsDeclared(ctx, r.Client, guestClient, s.cluster, s.bridge, ports.ForBridge(s.bridge)); err != nil {
		return ctrl.Result{}, err
	}

	// TODO(next issue: GuestWebhookBridge targets): select the targets, leave alone (mode
	// Auto) those the guest apiserver already reaches, create the guest NodePort and host
	// ClusterIP Services, repoint webhooks (url) and APIServices (ExternalName), verify TLS
	// from the host network, and report TargetsBridged, TargetsReachable and PortsDeclared.
	return ctrl.Result{}, nil
}

// reconcileDelete restores what reconcileNormal changed, then releases the object.
func (r *Reconciler) reconcileDelete(_ context.Context, s *scope) (ctrl.Result, error) {
	// TODO(next issue: GuestWebhookBridge targets): restore the original APIServices and
	// webhook configurations and delete the bridge's Services before the finalizer goes.
	controllerutil.RemoveFinalizer(s.bridge, guestnetv1.GuestWebhookBridgeFinalizer)
	return ctrl.Result{}, nil
}

// setReadyCondition summarises readyConditions into Ready.
func setReadyCondition(bridge *guestnetv1.GuestWebhookBridge) {
	clusterscope.SetReadyCondition(bridge, readyConditions...)
}
