//go:build !before_1_31

package storagee2e

import (
	"context"
	"time"

	clientset "k8s.io/client-go/kubernetes"
	e2epod "k8s.io/kubernetes/test/e2e/framework/pod"
)

func waitForSystemPods(ctx context.Context, c clientset.Interface, timeout time.Duration) error {
	return e2epod.WaitForPodsRunningReady(ctx, c, "kube-system", 0, timeout)
}
