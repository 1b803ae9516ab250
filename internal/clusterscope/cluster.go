package clusterscope

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/status"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/clustercache"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/guestbounds"
)

// Object is a guestnet object that carries conditions: a GuestIngress or a GuestWebhookBridge.
type Object = status.Object

// GetCluster returns the Cluster called name in namespace, or nil when there is none: a
// missing Cluster is a state reported in ClusterAvailable, not a reconcile error.
func GetCluster(ctx context.Context, c client.Reader, namespace, name string) (*clusterv1.Cluster, error) {
	cluster := &clusterv1.Cluster{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, cluster); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("getting Cluster %s/%s: %w", namespace, name, err)
	}
	return cluster, nil
}

// IsProvisioned reports whether the Cluster's infrastructure is provisioned: before that
// there is no guest apiserver, and the guest connections (internal/guestcache) do not even try.
func IsProvisioned(cluster *clusterv1.Cluster) bool {
	return cluster != nil && ptr.Deref(cluster.Status.Initialization.InfrastructureProvisioned, false)
}

// Connect sets ClusterAvailable on obj and returns a client for the guest cluster when the
// Cluster exists, is provisioned and the ClusterCache holds a connection to its apiserver.
// A nil client with a nil error means "not yet": the Cluster watch or the ClusterCache's
// connect event brings the object back, so there is nothing to poll.
func Connect(ctx context.Context, cc clustercache.ClusterCache, obj Object, cluster *clusterv1.Cluster) (client.Client, error) {
	guestClient, guestErr := GuestClient(ctx, cc, cluster)
	SetClusterAvailableCondition(obj, cluster, guestErr)

	if guestErr != nil && !errors.Is(guestErr, clustercache.ErrClusterNotConnected) && !IsGuestTooLarge(guestErr) {
		return nil, guestErr
	}
	return guestClient, nil
}

// GuestClient returns a client for the guest cluster when the Cluster exists, is provisioned
// and the ClusterCache holds a connection to its apiserver; guestErr is the ClusterCache's
// error (clustercache.ErrClusterNotConnected while it is not connected, wrapping a
// *kubeconfig.RefusedError when guestnet refuses the Cluster's kubeconfig Secret), for
// SetClusterAvailableCondition. Both are nil before the Cluster is provisioned.
//
// A guest that holds more objects of a kind guestnet caches than guestbounds.Default admits
// gets no client (a *guestbounds.TooLargeError, IsGuestTooLarge): the client's cache would
// hold them all in the manager every tenant shares.
func GuestClient(ctx context.Context, cc clustercache.ClusterCache, cluster *clusterv1.Cluster) (guestClient client.Client, guestErr error) {
	if !IsProvisioned(cluster) {
		return nil, nil
	}
	key := client.ObjectKeyFromObject(cluster)
	// Asked before GetClient: a first try that ends in between would otherwise turn a "not
	// connected" from before it into "unreachable", whatever the try found.
	tracker, tracks := cc.(ConnectTracker)
	notTried := tracks && !tracker.Tried(ctx, key)
	guestClient, err := cc.GetClient(ctx, key)
	if err != nil {
		if notTried && errors.Is(err, clustercache.ErrClusterNotConnected) {
			return nil, fmt.Errorf("%w: %w", err, errNotTriedYet)
		}
		return nil, err
	}
	uncached, err := cc.GetUncachedClient(ctx, key)
	if err != nil {
		return nil, err
	}
	// A connected guest is counted again from what its cache holds, when its client says.
	cached, _ := guestClient.(guestbounds.Cached)
	if err := guestbounds.Default.Check(ctx, key, uncached, cached); err != nil {
		return nil, err
	}
	return guestClient, nil
}

// IsGuestTooLarge reports whether err says that the guest holds more objects than guestnet
// caches (guestbounds); the bounds count again after guestbounds.DefaultCheckEvery.
func IsGuestTooLarge(err error) bool {
	var tooLarge *guestbounds.TooLargeError
	return errors.As(err, &tooLarge)
}

// GuestGone reports whether the guest of a Cluster is gone for good, so that nothing in it
// can be restored any more: the Cluster does not exist (cluster is nil), is being deleted,
// or its <cluster>-kubeconfig Secret does not exist. The Secret is read from the apiserver
// (reader should be uncached): a Secret a cache has not seen yet must not count as gone.
// why says which, for the event that tells the user what was left in the guest.
func GuestGone(ctx context.Context, reader client.Reader, namespace, clusterName string, cluster *clusterv1.Cluster) (gone bool, why string, err error) {
	switch {
	case cluster == nil:
		return true, fmt.Sprintf("Cluster %s/%s does not exist", namespace, clusterName), nil
	case !cluster.DeletionTimestamp.IsZero():
		return true, fmt.Sprintf("Cluster %s/%s is being deleted", namespace, clusterName), nil
	}
	secret := &metav1.PartialObjectMetadata{}
	secret.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Secret"))
	name := clusterName + "-kubeconfig"
	if err := reader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, secret); err != nil {
		if apierrors.IsNotFound(err) {
			return true, fmt.Sprintf("Secret %s/%s, through which guestnet reaches the guest apiserver, does not exist", namespace, name), nil
		}
		return false, "", fmt.Errorf("getting Secret %s/%s: %w", namespace, name, err)
	}
	return false, "", nil
}

// errNotTriedYet is GuestClient's error before the ClusterCache's first try to connect to the
// guest since the manager started (it wraps clustercache.ErrClusterNotConnected).
var errNotTriedYet = errors.New("guestnet has not tried to connect to it since it started")

// ConnectTracker is a ClusterCache that says whether it has tried to connect to a guest
// since it started (internal/guestcache).
type ConnectTracker interface {
	Tried(ctx context.Context, cluster client.ObjectKey) bool
}

// NotTriedYet reports whether guestErr (GuestClient's) says only that the ClusterCache has not
// tried to connect to the guest yet: a manager that has just started knows nothing of the
// guest, which is not "unreachable" (SetClusterAvailableCondition keeps what was reported).
// The ClusterCache's first try, success or failure, brings the object back.
func NotTriedYet(guestErr error) bool { return errors.Is(guestErr, errNotTriedYet) }
