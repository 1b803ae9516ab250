// Package ingress holds the pure logic of a GuestIngress: what guestnet applies to the guest
// ingress controller's Service, the host objects it builds (LoadBalancer Service,
// CiliumLoadBalancerIPPool, CiliumL2AnnouncementPolicy), how IP claims of GuestIngresses
// conflict, how ready endpoints are counted, and the conditions that report all of it.
//
// Nothing here talks to an apiserver: controllers/guestingress reads the objects, calls these
// functions and writes the results. Cilium's Go module is deliberately not imported (it
// doubles the manager binary and replaces client-go's request metrics, see the design
// notes): pools and policies are unstructured objects built from the field names of Cilium's
// CRDs, which the lab installs from Cilium's module so the tests check them against the real
// schema.
package ingress
