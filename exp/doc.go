// Package exp holds guestnet's experimental, feature-gated controllers. The first one to
// come reads the cluster's `guestnet` ClusterClass topology variable and manages the
// cluster's GuestIngress and GuestWebhookBridge from it (feature gate
// ClusterTopologyVariables, off by default).
package exp
