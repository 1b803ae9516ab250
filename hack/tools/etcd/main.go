// Command etcd is the lab's etcd: the upstream server's own entry point, built from
// the pinned go.etcd.io/etcd/server/v3 module so the tests need no download.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
