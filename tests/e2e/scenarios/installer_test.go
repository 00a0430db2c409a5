package scenarios

// A driver installed by the installer DaemonSet (deploy/installer-daemonset.yaml, its image as
// deploy/Dockerfile's installer target, built by cluster.sh) while everything runs, then
// uninstalled by the operator.

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

const (
	lateDriver  = "e2e/late"
	lateCSIName = "flexvolume-e2e--late"
	// The shipped DaemonSet's plugin dir: kubelet's default --volume-plugin-dir.
	shippedPluginDir = "/usr/libexec/kubernetes/kubelet-plugins/volume/exec"
)

// installerDaemonSet is deploy/installer-daemonset.yaml as shipped, with this cluster's image
// for it and this kubelet's plugin dir (KubeletPluginDir: the hostPath is resolved on the node,
// as kubelet sees it), and hostNetwork (it needs no address).
func (c *Cluster) installerDaemonSet() *appsv1.DaemonSet {
	ginkgo.GinkgoHelper()
	shipped, err := os.ReadFile(filepath.Join(c.Repo, "deploy", "installer-daemonset.yaml"))
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	var daemonset appsv1.DaemonSet
	gomega.Expect(yaml.UnmarshalStrict(shipped, &daemonset)).To(gomega.Succeed(), "deploy/installer-daemonset.yaml")
	spec := &daemonset.Spec.Template.Spec
	gomega.Expect(spec.Containers).To(gomega.HaveLen(1), "the installer's containers")
	spec.Containers[0].Image = c.InstallerImage
	spec.Containers[0].ImagePullPolicy = corev1.PullNever
	spec.HostNetwork = true
	replaced := 0
	for i := range spec.Volumes {
		if hostPath := spec.Volumes[i].HostPath; hostPath != nil && hostPath.Path == shippedPluginDir {
			hostPath.Path = c.KubeletPluginDir
			replaced++
		}
	}
	gomega.Expect(replaced).To(gomega.Equal(1), "host paths %s in the shipped DaemonSet", shippedPluginDir)
	return &daemonset
}

// kubeletPids are the pids of the node's kubelet.
func (c *Cluster) kubeletPids(ctx context.Context) string {
	ginkgo.GinkgoHelper()
	return MustRun(ctx, "pgrep", "-f", c.Path("bin", "kube")+" kubelet ")
}

// scenarioInstaller: flexd registers the installed driver with kubelet (CSINode) with neither
// restarted; the operator re-applies `flexd manifests` for its CSIDriver (the node pod is
// unchanged by it); a pod reads its data; `flexd uninstall` refuses while the volume is mounted
// and removes it once unmounted; kubelet forgets it. The node pod cannot write the plugin dir:
// only the installer and the operator do.
func scenarioInstaller(ctx context.Context) {
	c := cluster
	before := c.NodePodState(ctx)
	kubeletBefore := c.kubeletPids(ctx)
	lateDir := c.Path("plugins", pluginDirName(lateDriver))
	lateExecutable := filepath.Join(lateDir, "late")
	gomega.Expect(lateDir).NotTo(gomega.BeAnExistingFile(), "the driver before its installer ran")
	// Whatever happens, the driver goes at the end (after its pods and volumes, which the later
	// cleanups remove first), and so do its CSIDriver and the installer.
	ginkgo.DeferCleanup(func(ctx context.Context) {
		// The installer DaemonSet installed it on every node.
		c.FlexdEverywhere(ctx, "uninstall", "--driver", lateDriver)
	})
	ginkgo.DeferCleanup(func(ctx context.Context) {
		err := c.Kube.StorageV1().CSIDrivers().Delete(ctx, lateCSIName, metav1.DeleteOptions{})
		if !apierrors.IsNotFound(err) {
			gomega.Expect(err).NotTo(gomega.HaveOccurred())
		}
	})

	ginkgo.By("the installer DaemonSet, as shipped, with the installer image")
	daemonset := c.installerDaemonSet()
	_, err := c.Kube.AppsV1().DaemonSets(daemonset.Namespace).Create(ctx, daemonset, metav1.CreateOptions{})
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "creating the installer DaemonSet")
	ginkgo.DeferCleanup(c.deleteInstaller, daemonset)
	c.MustKubectl(ctx, "-n", daemonset.Namespace, "rollout", "status", "daemonset/"+daemonset.Name, "--timeout=180s")
	WaitFor(ctx, 60*time.Second, "the installed driver "+lateExecutable, executable(lateExecutable))
	gomega.Expect(bytes.Equal([]byte(ReadFile(lateExecutable)), []byte(ReadFile(c.Path("run", "late"))))).To(gomega.BeTrue(),
		"the installed driver differs from the installer image's")
	c.WaitCSINodeLists(ctx, lateCSIName)

	ginkgo.By("the operator re-applies `flexd manifests` for the new driver's CSIDriver")
	// What the operator is told: kubelet alone would wait for an attachment nobody makes.
	_, err = c.Kube.StorageV1().CSIDrivers().Get(ctx, lateCSIName, metav1.GetOptions{})
	gomega.Expect(apierrors.IsNotFound(err)).To(gomega.BeTrue(), "a CSIDriver %s before the operator made one: %v", lateCSIName, err)
	c.ApplyManifests(ctx, "flexd-late")
	late, err := c.Kube.StorageV1().CSIDrivers().Get(ctx, lateCSIName, metav1.GetOptions{})
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	gomega.Expect(*late.Spec.AttachRequired).To(gomega.BeFalse(), "the late driver's attachRequired")
	_, err = c.Kube.StorageV1().CSIDrivers().Get(ctx, c.CSIName, metav1.GetOptions{})
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "the first driver's CSIDriver")

	ginkgo.By("checking neither flexd nor kubelet restarted")
	gomega.Expect(c.NodePodState(ctx)).To(gomega.Equal(before), "flexd's node pod (uid, restarts)")
	gomega.Expect(c.kubeletPids(ctx)).To(gomega.Equal(kubeletBefore), "kubelet's pids")

	ginkgo.By("a pod reading the new driver's volume")
	c.StaticClaim(ctx, PersistentVolume("e2e-late", "1Gi", CSISource(lateCSIName, "e2e-late", map[string]string{"greeting": "installed late"})))
	log := c.RunPod(ctx, c.ToolsPod("e2e-late", "cat /data/driver; echo late > /data/pod", ClaimVolume("e2e-late"), nil), 180*time.Second)
	gomega.Expect(LogLines(log)).To(gomega.ContainElement("hostdir e2e-late installed late"))
	gomega.Expect(ReadFile(c.Path("volumes", "e2e-late", "pod"))).To(gomega.Equal("late\n"))
	target := c.VolumeTarget(c.PodUID(ctx, "e2e-late"), "e2e-late")
	gomega.Expect(MountCount(target)).To(gomega.Equal(1), "mounts of %s", target)

	ginkgo.By("`flexd uninstall` refuses while the volume is mounted")
	// By the operator on the node: the plugin dir, and the state dir whose records say which
	// volumes still use the driver.
	out, err := c.Flexd(ctx, "uninstall", "--driver", lateDriver)
	gomega.Expect(err).To(gomega.HaveOccurred(), "flexd uninstall removed a driver in use: %s", out)
	gomega.Expect(err.Error()).To(gomega.ContainSubstring("is used by 1 mounted volume"))
	gomega.Expect(executable(lateExecutable)(ctx)).To(gomega.Succeed(), "the driver after the refusal")

	ginkgo.By("the pod deleted, the installer removed")
	c.DeletePod(ctx, "e2e-late")
	c.ExpectUnpublished(ctx, target)
	c.deleteInstaller(ctx, daemonset)

	ginkgo.By("the node pod cannot write the plugin dir: its mount is read-only")
	// In the pod the plugin dir is where its hostPath is mounted: at kubelet's path.
	out, err = c.Kubectl(ctx, "-n", c.Namespace, "exec", c.NodePod(ctx).Name, "-c", "flexd", "--",
		"flexd", "--plugin-dir", c.KubeletPluginDir, "--state-dir", c.Path("flexd-state"), "uninstall", "--driver", lateDriver)
	gomega.Expect(err).To(gomega.HaveOccurred(), "the node pod could write the plugin dir: %s", out)
	gomega.Expect(err.Error()).To(gomega.ContainSubstring("Read-only file system"), "the node pod's uninstall failed for another reason")
	gomega.Expect(executable(lateExecutable)(ctx)).To(gomega.Succeed(), "the driver after the refusal")

	ginkgo.By("`flexd uninstall` on the node: the driver gone, kubelet forgets it")
	c.MustFlexdEverywhere(ctx, "uninstall", "--driver", lateDriver)
	gomega.Expect(lateDir).NotTo(gomega.BeAnExistingFile())
	c.WaitCSINodeLacks(ctx, lateCSIName)
	gomega.Expect(c.NodePodState(ctx)).To(gomega.Equal(before), "flexd's node pod (uid, restarts)")
}

// deleteInstaller deletes the installer DaemonSet, if it is there, and waits until its pods are gone.
func (c *Cluster) deleteInstaller(ctx context.Context, daemonset *appsv1.DaemonSet) {
	ginkgo.GinkgoHelper()
	_, err := c.Kubectl(ctx, "-n", daemonset.Namespace, "delete", "daemonset", daemonset.Name, "--ignore-not-found", "--wait=true", "--timeout=120s")
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "deleting the installer DaemonSet")
	WaitFor(ctx, 120*time.Second, "the installer's pods to go", func(ctx context.Context) error {
		pods, err := c.Kube.CoreV1().Pods(daemonset.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + daemonset.Name})
		if err != nil {
			return err
		}
		if len(pods.Items) > 0 {
			return fmt.Errorf("%d installer pods left", len(pods.Items))
		}
		return nil
	})
}

// executable fails unless path is an executable file.
func executable(path string) func(context.Context) error {
	return func(context.Context) error {
		info, err := os.Stat(path)
		if err != nil {
			return err
		}
		if !info.Mode().IsRegular() || info.Mode().Perm()&0o111 == 0 {
			return fmt.Errorf("%s is not an executable file: %v", path, info.Mode())
		}
		return nil
	}
}
