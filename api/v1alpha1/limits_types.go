package v1alpha1

// Reasons of what an optional API or a bound of guestnet's takes away from one object only
// (docs/decisions/0009-bounded-guests.md).
const (
	// CiliumLBIPAMNotInstalledReason (GuestIngress LoadBalancerReady and Ready): the host
	// apiserver does not serve Cilium's CiliumLoadBalancerIPPool or
	// CiliumL2AnnouncementPolicy. guestnet creates nothing for the GuestIngress; it looks for
	// the CRDs again every 30 s and builds the chain once they are installed, without a
	// restart. GuestWebhookBridges do not need Cilium and keep working.
	CiliumLBIPAMNotInstalledReason = "CiliumLBIPAMNotInstalled"
	// GuestTooLargeReason (ClusterAvailable and Ready of GuestIngress and GuestWebhookBridge):
	// the guest holds more Services, webhook configurations or APIServices than guestnet
	// caches per guest cluster (the manager's --guest-max-objects, 5000 by default). guestnet
	// caches nothing of that guest and changes nothing for its objects; it counts again every
	// minute. Other guests are not affected.
	GuestTooLargeReason = "GuestTooLarge"
)
