//go:build before_1_31

package storagee2e

import (
	"context"
	"time"

	clientset "k8s.io/client-go/kubernetes"
	e2epod "k8s.io/kubernetes/test/e2e/framework/pod"
)

// Before 1.31 the wait also took how many pods may stay not ready.
func waitForSystemPods(ctx context.Context, c clientset.Interface, timeout time.Duration) error {
	return e2epod.WaitForPodsRunningReady(ctx, c, "kube-system", 0, 0, timeout)
}
