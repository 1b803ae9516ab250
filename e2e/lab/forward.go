package lab

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// The lab's stand-ins (masquerade NAT, kube-proxy, pod network namespaces) all forward TCP
// connections the same way: accept, dial the other side, copy both ways.

// serveForwardWith copies each connection accepted on l to a connection from dial, both
// ways, until l closes; then it closes the connections still open (the stand-in is gone, and
// so is the path: a client holding a keep-alive connection must not keep it alive) and
// returns once they are done.
func serveForwardWith(l net.Listener, dial func(context.Context) (net.Conn, error)) {
	var (
		conns sync.WaitGroup
		mu    sync.Mutex
		open  = map[net.Conn]bool{}
	)
	track := func(c net.Conn, add bool) {
		mu.Lock()
		defer mu.Unlock()
		if add {
			open[c] = true
		} else {
			delete(open, c)
		}
	}
	defer func() {
		mu.Lock()
		for c := range open {
			_ = c.Close()
		}
		mu.Unlock()
		conns.Wait()
	}()
	for {
		in, err := l.Accept()
		if err != nil {
			return
		}
		track(in, true)
		conns.Go(func() {
			defer track(in, false)
			defer in.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			out, err := dial(ctx)
			cancel()
			if err != nil {
				return
			}
			track(out, true)
			defer track(out, false)
			defer out.Close()
			pipe(in, out)
		})
	}
}

// dialTCP dials target.
func dialTCP(target string) func(context.Context) (net.Conn, error) {
	return func(ctx context.Context) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "tcp", target)
	}
}

// errNoEndpoint: a stand-in has nowhere to forward a connection to; it is closed.
var errNoEndpoint = errors.New("no ready endpoint")

// pipe copies a to b and b to a until both directions are done.
func pipe(a, b net.Conn) {
	var wg sync.WaitGroup
	copyHalf := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		if c, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = c.CloseWrite()
		} else {
			_ = dst.Close()
		}
	}
	wg.Go(func() { copyHalf(a, b) })
	wg.Go(func() { copyHalf(b, a) })
	wg.Wait()
}
