package scenarios

// The operator guide's example (docs/operator-guide.md): examples/kubernetes/loop-app.yaml,
// applied unchanged to flexd deployed with its builtin loop driver. `tests/e2e/run.sh up` runs
// this scenario and keeps what it made (E2E_EXAMPLE_KEEP=1), for a person to look around.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// scenarioExample: the example's claim Bound by the loop driver's provisioner, its pod Running
// as uid 1000 and writing to the volume, the file's owner and group 1000 (the pod's fsGroup).
func scenarioExample(ctx context.Context) {
	c := cluster
	example := filepath.Join(c.Repo, "examples", "kubernetes", "loop-app.yaml")
	keep := os.Getenv("E2E_EXAMPLE_KEEP") == "1"

	ginkgo.By("README's deploy steps, which this scenario takes in README's order")
	steps := readmeDeploySteps(c.Repo)
	at := -1
	for _, step := range []string{"flexd install --builtin loop", "flexd manifests ", "kubectl apply -f flexd.yaml", "kubectl apply -f examples/kubernetes/loop-app.yaml"} {
		found := slices.IndexFunc(steps, func(line string) bool { return strings.HasPrefix(line, step) })
		gomega.Expect(found).To(gomega.BeNumerically(">", at), "README's deploy steps: %q missing or out of order in\n%s", step, strings.Join(steps, "\n"))
		at = found
	}

	ginkgo.By("flexd deployed with the builtin loop driver")
	c.InstallLoop(ctx)
	c.ApplyAllManifests(ctx, "flexd-example")
	c.WaitCSINodeLists(ctx, loopCSIName)

	ginkgo.By("kubectl apply -f examples/kubernetes/loop-app.yaml")
	c.MustKubectl(ctx, "apply", "-f", example)
	if !keep {
		ginkgo.DeferCleanup(c.deleteExample, example)
	}
	c.WaitClaimBound(ctx, "flexd-example", 180*time.Second)
	c.WaitPodReady(ctx, "flexd-example", 240*time.Second)

	ginkgo.By("the pod's log: what it wrote, owned by its user and fsGroup")
	var log string
	WaitFor(ctx, 60*time.Second, "the example pod's log", func(ctx context.Context) error {
		out, err := c.Kube.CoreV1().Pods(podNamespace).GetLogs("flexd-example", &corev1.PodLogOptions{}).DoRaw(ctx)
		log = string(out)
		if err != nil {
			return err
		}
		if !regexp.MustCompile(`(?m) hello$`).MatchString(log) {
			return fmt.Errorf("no listing of hello in its log:\n%s", log)
		}
		return nil
	})
	fmt.Fprintf(ginkgo.GinkgoWriter, "the example pod's log:\n%s", log)
	gomega.Expect(log).To(gomega.MatchRegexp(`(?m)^-rw-r--r-- +1 1000 +1000 .* hello$`), "the file the pod wrote: owner 1000, group 1000")
	gomega.Expect(ReadFileInPod(ctx, c, "flexd-example", "/data/hello")).To(gomega.Equal("hello from flexd\n"))
}

// ReadFileInPod reads a file in the pod's first container.
func ReadFileInPod(ctx context.Context, c *Cluster, pod, path string) string {
	ginkgo.GinkgoHelper()
	return c.MustKubectl(ctx, "exec", pod, "--", "cat", path)
}

// deleteExample deletes what the example made and waits until the loop driver has deleted the
// provisioned volume.
func (c *Cluster) deleteExample(ctx context.Context, example string) {
	claim, err := c.Kube.CoreV1().PersistentVolumeClaims(podNamespace).Get(ctx, "flexd-example", metav1.GetOptions{})
	volume := ""
	if err == nil {
		volume = claim.Spec.VolumeName
	}
	_, err = c.Kubectl(ctx, "delete", "--ignore-not-found", "--wait=true", "--timeout=180s", "-f", example)
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "deleting the example")
	if volume == "" {
		return
	}
	WaitFor(ctx, 180*time.Second, "the provisioned volume "+volume+" to be deleted", func(ctx context.Context) error {
		_, err := c.Kube.CoreV1().PersistentVolumes().Get(ctx, volume, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("PV %s is still there (%v)", volume, err)
	})
}

// readmeDeploySteps are the commands of README's "Deploy to a cluster" block, without comments.
func readmeDeploySteps(repo string) []string {
	ginkgo.GinkgoHelper()
	text := ReadFile(filepath.Join(repo, "README.md"))
	_, section, found := strings.Cut(text, "\n## Deploy to a cluster\n")
	gomega.Expect(found).To(gomega.BeTrue(), "README has no \"Deploy to a cluster\" section")
	_, block, found := strings.Cut(section, "```sh\n")
	gomega.Expect(found).To(gomega.BeTrue(), "README's deploy section has no sh block")
	block, _, _ = strings.Cut(block, "```")
	var steps []string
	for _, line := range strings.Split(block, "\n") {
		if command, _, _ := strings.Cut(line, " #"); strings.TrimSpace(command) != "" {
			steps = append(steps, strings.TrimSpace(command))
		}
	}
	return steps
}
