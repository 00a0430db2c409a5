// Command kube is a single-node Kubernetes cluster's control plane and node in one multi-call
// binary, built from pinned modules (tests/e2e/go.mod): etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler, kubelet and kubectl. One binary links the shared
// packages once, where six would each link them again (most of a cold build on two cores).
//
// Called through a link named after a component, or as `kube COMPONENT ARGS...`.
//
// Built for every Kubernetes minor the e2e runs (tests/e2e/kubernetes/): where a release's API
// differs, a file for each side is chosen by the before_1_N build tags tools.sh sets.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	_ "time/tzdata"

	"go.etcd.io/etcd/server/v3/etcdmain"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	kubectl "k8s.io/kubectl/pkg/cmd"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

var components = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl"}

func main() {
	name, args := filepath.Base(os.Args[0]), os.Args[1:]
	if name == "kube" {
		if len(args) == 0 {
			fmt.Fprintf(os.Stderr, "usage: kube COMPONENT [ARGS...] (one of %v)\n", components)
			os.Exit(2)
		}
		name, args = args[0], args[1:]
	}
	// The components read their own arguments from os.Args.
	os.Args = append([]string{name}, args...)
	switch name {
	case "etcd":
		etcdmain.Main(os.Args)
	case "kube-apiserver":
		os.Exit(cli.Run(apiserver.NewAPIServerCommand()))
	case "kube-controller-manager":
		os.Exit(cli.Run(controllermanager.NewControllerManagerCommand()))
	case "kube-scheduler":
		os.Exit(cli.Run(scheduler.NewSchedulerCommand()))
	case "kubelet":
		os.Exit(cli.Run(newKubeletCommand()))
	case "kubectl":
		os.Exit(cli.Run(kubectl.NewDefaultKubectlCommand()))
	default:
		fmt.Fprintf(os.Stderr, "kube: unknown component %q (one of %v)\n", name, components)
		os.Exit(2)
	}
}
