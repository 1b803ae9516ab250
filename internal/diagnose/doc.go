// Package diagnose is the `manager diagnose` command: it reads one guest cluster's host
// objects (Cluster, MachineDeployments, KubevirtMachineTemplates, virt-launcher pods,
// guestnet's Services and their EndpointSlices, GuestIngresses, GuestWebhookBridges) and its
// guest (APIServices, webhook configurations, konnectivity agents, the Cilium tunnel
// configuration), and prints one verdict per item of the runbook (docs/runbook.md): OK, WARN
// or FAIL, with the fix for every WARN and FAIL.
//
// The package is split in three: a thin fetch layer (fetch.go: Gather, ProbeTargets) that
// reads everything once, pure checks over what was read (checks_*.go, targets.go: Diagnose),
// and the command (command.go: Run). The checks decide nothing themselves that guestnet
// already decides: the worker port set and template analysis come from internal/ports, the
// webhook and APIService classification from internal/bridge (Select, MakePlan, the
// konnectivity evidence, the probe and its messages), the worker selector from
// internal/virtlauncher and endpoint counting from internal/ingress. diagnose only reports.
package diagnose
