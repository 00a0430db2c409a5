package scenarios

// The preflight scenario: `flexd preflight --cluster` on node 0, as an operator runs it before
// deploying, against the real API server, kubelet dir and plugin dir.

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

type preflightReport struct {
	Findings []struct {
		Check    string `json:"check"`
		Severity string `json:"severity"`
		Summary  string `json:"summary"`
		Advice   string `json:"advice"`
	} `json:"findings"`
	Errors   int `json:"errors"`
	Warnings int `json:"warnings"`
}

// preflight runs `flexd preflight --cluster -o json` for node 0's dirs and the cluster's
// kubeconfig; it exits 0 (no error finding) or the spec fails.
func (c *Cluster) preflight(ctx context.Context) (preflightReport, map[string]string) {
	ginkgo.GinkgoHelper()
	out := c.MustFlexd(ctx, "--output", "json", "preflight", "--kubelet-dir", c.Path("kubelet"),
		"--cluster", "--kubeconfig", c.Path("kubeconfig"))
	var report preflightReport
	gomega.Expect(json.Unmarshal([]byte(out), &report)).To(gomega.Succeed(), "preflight's JSON: %s", out)
	severities := map[string]string{}
	for _, f := range report.Findings {
		severities[f.Check] = f.Severity
		fmt.Fprintf(ginkgo.GinkgoWriter, "%-8s %-24s %s\n", f.Severity, f.Check, f.Summary)
	}
	return report, severities
}

// scenarioPreflight: every node finding ok on node 0 (its kubelet dir, plugin dir, cgroups,
// propagation); the API server's minor found, with the sidecars flexd manifests would deploy for
// it; and the kube-controller-manager findings a real cluster gives: none in a pod here (it runs
// as a process), then a kubeadm 1.36-like pod (the official image, no FlexVolume mount) that
// preflight must report.
func scenarioPreflight(ctx context.Context) {
	c := cluster
	version, err := c.Kube.Discovery().ServerVersion()
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	minor := strings.TrimSuffix(version.Minor, "+")

	ginkgo.By("flexd preflight --cluster on node 0, kube-controller-manager running as a process")
	report, severities := c.preflight(ctx)
	gomega.Expect(report.Errors).To(gomega.BeZero(), "error findings")
	for _, check := range []string{"kernel", "cgroups", "plugin-dir", "kubelet-dir", "mount-propagation", "loop-devices", "tools", "kubernetes-version"} {
		gomega.Expect(severities).To(gomega.HaveKeyWithValue(check, "ok"), "the %s finding", check)
	}
	gomega.Expect(severities).To(gomega.HaveKeyWithValue("kube-controller-manager", "warning"), "no kube-controller-manager pod")
	for _, f := range report.Findings {
		switch f.Check {
		case "kubernetes-version":
			gomega.Expect(f.Summary).To(gomega.ContainSubstring("--kubernetes-version 1."+minor), "what to pass to flexd manifests")
			gomega.Expect(f.Summary).To(gomega.ContainSubstring("csi-provisioner:"), "the sidecars it would deploy")
		case "kube-controller-manager":
			gomega.Expect(f.Summary).To(gomega.ContainSubstring("no kube-controller-manager pod"))
		}
	}

	ginkgo.By("a kube-controller-manager pod as kubeadm 1.36 writes it: the official image, no FlexVolume mount")
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-controller-manager-preflight", Namespace: "kube-system",
			Labels: map[string]string{"component": "kube-controller-manager", "tier": "control-plane"}},
		Spec: corev1.PodSpec{
			// Scheduled nowhere: only its spec is read, no image is pulled.
			NodeSelector: map[string]string{"flexd-e2e/no-such-node": "true"},
			Containers: []corev1.Container{{
				Name:         "kube-controller-manager",
				Image:        "registry.k8s.io/kube-controller-manager:v1.36.3",
				Command:      []string{"kube-controller-manager", "--flex-volume-plugin-dir=/usr/libexec/kubernetes/kubelet-plugins/volume/exec"},
				VolumeMounts: []corev1.VolumeMount{{Name: "k8s-certs", MountPath: "/etc/kubernetes/pki", ReadOnly: true}},
			}},
			Volumes: []corev1.Volume{{Name: "k8s-certs", VolumeSource: corev1.VolumeSource{
				HostPath: &corev1.HostPathVolumeSource{Path: "/etc/kubernetes/pki"}}}},
		},
	}
	_, err = c.Kube.CoreV1().Pods("kube-system").Create(ctx, pod, metav1.CreateOptions{})
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	ginkgo.DeferCleanup(func(ctx context.Context) {
		zero := int64(0)
		_ = c.Kube.CoreV1().Pods("kube-system").Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	})

	report, severities = c.preflight(ctx)
	gomega.Expect(severities).To(gomega.HaveKeyWithValue("kube-controller-manager", "warning"))
	for _, f := range report.Findings {
		if f.Check == "kube-controller-manager" {
			gomega.Expect(f.Summary+" "+f.Advice).To(gomega.And(
				gomega.ContainSubstring("cannot see FlexVolume drivers"),
				gomega.ContainSubstring("shell")), "the finding for a pod without the FlexVolume mount, on the distroless image")
		}
	}
}
