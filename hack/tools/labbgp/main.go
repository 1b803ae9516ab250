// Command lab-bgp is the lab's BGP, built on GoBGP (github.com/osrg/gobgp/v3) as a library.
//
//	lab-bgp router  ...  an upstream router: accepts sessions from the lab's speakers and
//	                     serves what it learned (paths, peers) as JSON on a unix socket.
//	lab-bgp speaker ...  one node's BGP speaker: peers and per-peer announcements are set over
//	                     its unix socket (the lab's played Cilium BGP control plane drives it).
//
// Both are real BGP: TCP sessions, OPEN/UPDATE/KEEPALIVE, GoBGP's RIB and policies. The lab
// runs them inside its private network namespace (hack/labns), on addresses local to it.
package main

import (
	"fmt"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: lab-bgp router|speaker [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "router":
		err = runRouter(os.Args[2:])
	case "speaker":
		err = runSpeaker(os.Args[2:])
	default:
		err = fmt.Errorf("unknown subcommand %q: want router or speaker", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "lab-bgp:", err)
		os.Exit(1)
	}
}
