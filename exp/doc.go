// Package exp holds guestnet's experimental, feature-gated controllers. exp/topology reads the
// cluster's `guestnet` ClusterClass topology variable and manages the cluster's GuestIngress
// and GuestWebhookBridge from it (feature gate ClusterTopologyVariables, alpha, off by
// default; docs/topology.md).
package exp
