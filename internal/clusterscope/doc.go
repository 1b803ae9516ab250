// Package clusterscope holds what both guestnet controllers share about the CAPI Cluster an
// object serves (spec.clusterName, in the object's namespace): looking the Cluster up, the
// pause rule, the conditions every guestnet object carries (Paused, ClusterAvailable,
// Ready), the events recorded when conditions change, and the index and mapping that turn
// a Cluster event into requests for the objects that name it.
//
// Keeping these in one place keeps the two controllers' behaviour identical where users
// expect it to be: the same pause semantics, the same messages, the same events.
package clusterscope
