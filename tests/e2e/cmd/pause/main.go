// Command pause is the e2e cluster's pause image (the pod sandbox: it holds the pod's
// namespaces) and the init of the cluster's pid namespace (tests/e2e/run.sh): it sleeps until
// SIGTERM or SIGINT and reaps every child re-parented to it, as an init must. Static
// (CGO_ENABLED=0), so the image is this one file.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 16)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range signals {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var status syscall.WaitStatus
			if pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil); pid <= 0 || err != nil {
				break
			}
		}
	}
}
