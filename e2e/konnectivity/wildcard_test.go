package konnectivity

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
)

// With the konnectivity server and agents running, nothing listens on a wildcard address of
// the lab's network namespace: the server binds its agent port on the apiserver's address and
// its health and admin ports on a loopback address (its flags' defaults bind every address);
// the agents bind inside their own namespaces.
func TestKonnectivityLab_NothingListensOnWildcardAddresses(t *testing.T) {
	g := NewWithT(t)
	_, s := start(t)
	startAgents(t, s)
	var wildcard []string
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6", "/proc/net/udp", "/proc/net/udp6"} {
		data, err := os.ReadFile(f)
		g.Expect(err).NotTo(HaveOccurred())
		sc := bufio.NewScanner(bytes.NewReader(data))
		sc.Scan() // header
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 4 {
				continue
			}
			local, state := fields[1], fields[3]
			listening := state == "0A" || (strings.HasPrefix(f, "/proc/net/udp") && state == "07")
			host, port, _ := strings.Cut(local, ":")
			p, _ := strconv.ParseUint(port, 16, 16)
			if listening && p != 0 && strings.Trim(host, "0") == "" {
				wildcard = append(wildcard, fmt.Sprintf("%s port %d", f, p))
			}
		}
	}
	g.Expect(wildcard).To(BeEmpty())
}
