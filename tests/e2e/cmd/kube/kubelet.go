//go:build !before_1_34

package main

import (
	"context"

	"github.com/spf13/cobra"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

// Since 1.34 the kubelet's command takes the context it runs under.
func newKubeletCommand() *cobra.Command { return kubelet.NewKubeletCommand(context.Background()) }
