package v1alpha1

// Reasons of a refused <cluster>-kubeconfig Secret (docs/decisions/0006-untrusted-kubeconfigs.md).
const (
	// KubeconfigRefusedReason (ClusterAvailable and Ready of GuestIngress and
	// GuestWebhookBridge): the Cluster's <cluster>-kubeconfig Secret holds something guestnet
	// never uses: an exec plugin, an auth provider, a file path, a proxy, insecure TLS, a
	// server that is not the Cluster's spec.controlPlaneEndpoint, or no inline CA or
	// credential. guestnet connects to nothing with it; the message names each refused field
	// and what to write instead. Once the Secret is corrected, guestnet connects within 30 s.
	KubeconfigRefusedReason = "KubeconfigRefused"
)
