//go:build before_1_34

package main

import (
	"github.com/spf13/cobra"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

func newKubeletCommand() *cobra.Command { return kubelet.NewKubeletCommand() }
