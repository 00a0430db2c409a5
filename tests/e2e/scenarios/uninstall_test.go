package scenarios

// flexd removed by the steps of docs/upgrade.md#uninstall, with workloads' data on a volume
// flexd provisioned (kept by its reclaim policy) and on a node-only driver's volume: nothing of
// flexd is left in the API server or on the nodes, and the data is where it was.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

const uninstallClass = "flexd-uninstall"

// flexdLeftInAPIServer lists what of flexd the API server still has: its namespace, cluster
// roles and bindings, CRD, CSIDrivers, and the drivers kubelet still lists in CSINodes.
func (c *Cluster) flexdLeftInAPIServer(ctx context.Context) ([]string, error) {
	var left []string
	if _, err := c.Kube.CoreV1().Namespaces().Get(ctx, c.Namespace, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		left = append(left, "namespace "+c.Namespace)
	}
	for _, kind := range []string{"clusterroles", "clusterrolebindings"} {
		out, err := c.Kubectl(ctx, "get", kind, "-o", "name")
		if err != nil {
			return nil, err
		}
		for _, name := range LogLines(out) {
			if strings.HasPrefix(name[strings.Index(name, "/")+1:], "flexd") {
				left = append(left, name)
			}
		}
	}
	if out, err := c.Kubectl(ctx, "get", "crd", "flexdrecords.flexd.io", "--ignore-not-found", "-o", "name"); err != nil {
		return nil, err
	} else if strings.TrimSpace(out) != "" {
		left = append(left, "CRD flexdrecords.flexd.io")
	}
	drivers, err := c.Kube.StorageV1().CSIDrivers().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for _, driver := range drivers.Items {
		if strings.HasPrefix(driver.Name, "flexvolume-") {
			left = append(left, "CSIDriver "+driver.Name)
		}
	}
	for _, node := range c.Nodes {
		listed, err := c.CSINodeDriversOn(ctx, node.Name)
		if err != nil {
			return nil, err
		}
		for _, driver := range listed {
			if strings.HasPrefix(driver, "flexvolume-") {
				left = append(left, "CSINode "+node.Name+" driver "+driver)
			}
		}
	}
	return left, nil
}

// flexdLeftOnNodes lists what of flexd each node still has: its state dir, its CSI and
// registration sockets in kubelet's dirs.
func (c *Cluster) flexdLeftOnNodes() []string {
	ginkgo.GinkgoHelper()
	var left []string
	for _, node := range c.Nodes {
		state, err := os.ReadDir(node.Path("flexd-state"))
		if err != nil && !os.IsNotExist(err) {
			gomega.Expect(err).NotTo(gomega.HaveOccurred())
		}
		for _, entry := range state {
			left = append(left, node.Name+": "+node.Path("flexd-state", entry.Name()))
		}
		for _, pattern := range []string{"plugins/flexvolume-*", "plugins_registry/flexvolume-*"} {
			matches, err := filepath.Glob(node.Path("kubelet", pattern))
			gomega.Expect(err).NotTo(gomega.HaveOccurred())
			for _, match := range matches {
				left = append(left, node.Name+": "+match)
			}
		}
	}
	return left
}

// scenarioUninstall: the documented uninstall, then checks that nothing of flexd is left and
// the workloads' data is; flexd is deployed again when it ends, and the kept volume deleted.
func scenarioUninstall(ctx context.Context) {
	c := cluster
	summary := c.NewSummary("uninstall")
	c.InstallLoop(ctx)
	applied := c.ApplyAllManifests(ctx, "flexd-uninstall")
	manifests := c.Path("run", "flexd-uninstall.yaml")
	gomega.Expect(ReadFile(manifests)).To(gomega.Equal(applied))

	ginkgo.By("workloads' data: a provisioned loop volume and a node-only driver's volume")
	pv := c.ProvisionedLoopClaim(ctx, uninstallClass)
	c.RunPod(ctx, c.ToolsPod("e2e-uninstall-loop", "echo kept > /data/file", ClaimVolume(uninstallClass), nil), 180*time.Second)
	c.RunPod(ctx, c.ToolsPod("e2e-uninstall-hostdir", "echo kept > /data/file", InlineCSIVolume(c.CSIName, map[string]string{"volume": "e2e-uninstall"}), nil), 180*time.Second)
	hostdirFile := c.Path("volumes", "e2e-uninstall", "file")
	ginkgo.DeferCleanup(func() { _ = os.RemoveAll(filepath.Dir(hostdirFile)) })

	// Whatever happens, flexd is deployed again (the suite's later scenarios, if any, and the
	// kept volume's deletion need it), and the kept volume goes by csi-provisioner's deletion of
	// a released volume.
	ginkgo.DeferCleanup(func(ctx context.Context) {
		// A namespace being deleted takes no new objects: wait for it to go first.
		WaitFor(ctx, 300*time.Second, "the namespace "+c.Namespace+" gone or not terminating", func(ctx context.Context) error {
			namespace, err := c.Kube.CoreV1().Namespaces().Get(ctx, c.Namespace, metav1.GetOptions{})
			if apierrors.IsNotFound(err) || (err == nil && namespace.DeletionTimestamp == nil) {
				return nil
			}
			return fmt.Errorf("namespace %s is terminating (%v)", c.Namespace, err)
		})
		c.ApplyAllManifests(ctx, "flexd-uninstall-redeploy")
		_, err := c.Kube.CoreV1().PersistentVolumes().Patch(ctx, pv, types.MergePatchType,
			[]byte(`{"spec":{"persistentVolumeReclaimPolicy":"Delete"}}`), metav1.PatchOptions{})
		if apierrors.IsNotFound(err) {
			return
		}
		gomega.Expect(err).NotTo(gomega.HaveOccurred(), "the kept volume's reclaim policy back to Delete")
	})

	ginkgo.By("step 1: the provisioned volume kept (reclaim policy Retain), the workloads deleted")
	c.MustKubectl(ctx, "patch", "pv", pv, "-p", `{"spec":{"persistentVolumeReclaimPolicy":"Retain"}}`)
	c.DeletePod(ctx, "e2e-uninstall-loop")
	c.DeletePod(ctx, "e2e-uninstall-hostdir")
	c.DeleteClaimIfThere(ctx, uninstallClass)

	ginkgo.By("step 2: no VolumeAttachment of flexd's drivers left")
	WaitFor(ctx, 180*time.Second, "no VolumeAttachment of a flexvolume- driver", func(ctx context.Context) error {
		out, err := c.Kubectl(ctx, "get", "volumeattachments", "-o", "custom-columns=NAME:.metadata.name,ATTACHER:.spec.attacher", "--no-headers")
		if err != nil {
			return err
		}
		if strings.Contains(out, "flexvolume-") {
			return fmt.Errorf("VolumeAttachments left:\n%s", out)
		}
		return nil
	})

	ginkgo.By("step 3: the controller's records saved (nothing attached now), for the kept volume's deletion later")
	// The guide's command as it is, with the cluster's kubectl.
	records := c.Path("run", "flexd-records.json")
	kubectl := c.Path("bin", "kube") + " kubectl --kubeconfig=" + c.Path("kubeconfig")
	MustRun(ctx, "sh", "-euc", kubectl+` -n `+c.Namespace+` get flexdrecords -o json |
  jq 'del(.items[].metadata | .resourceVersion, .uid, .creationTimestamp, .generation, .managedFields)' > `+records)
	gomega.Expect(ReadFile(records)).To(gomega.ContainSubstring(pv), "the saved records")

	ginkgo.By("step 4: kubectl delete -f with the manifests that were applied")
	// --ignore-not-found: the namespace, first in the file, takes what is in it along, and the
	// service account token Secret goes with its account, before kubectl comes to them.
	deleted := c.MustKubectl(ctx, "delete", "-f", manifests, "--ignore-not-found", "--wait=true", "--timeout=300s")
	summary.Printf("kubectl delete -f flexd.yaml:\n%s", deleted)

	ginkgo.By("step 5: on every node, flexd's state dir emptied")
	// The guide removes the dir; here a worker's is a mount point in its node's namespace, which
	// must stay for the redeployment at the end: its contents go.
	for _, node := range c.Nodes {
		entries, err := os.ReadDir(node.Path("flexd-state"))
		gomega.Expect(err).NotTo(gomega.HaveOccurred())
		for _, entry := range entries {
			gomega.Expect(os.RemoveAll(node.Path("flexd-state", entry.Name()))).To(gomega.Succeed())
		}
	}

	ginkgo.By("nothing of flexd is left in the API server or on the nodes")
	WaitFor(ctx, 120*time.Second, "nothing of flexd in the API server", func(ctx context.Context) error {
		left, err := c.flexdLeftInAPIServer(ctx)
		if err != nil {
			return err
		}
		if len(left) > 0 {
			return fmt.Errorf("left: %s", strings.Join(left, ", "))
		}
		return nil
	})
	gomega.Expect(c.flexdLeftOnNodes()).To(gomega.BeEmpty(), "flexd's files left on the nodes")

	ginkgo.By("the workloads' data is where it was")
	gomega.Expect(ReadFile(hostdirFile)).To(gomega.Equal("kept\n"), "the node-only driver's volume")
	kept, err := c.Kube.CoreV1().PersistentVolumes().Get(ctx, pv, metav1.GetOptions{})
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "the kept volume's PV")
	gomega.Expect(kept.Spec.PersistentVolumeReclaimPolicy).To(gomega.Equal(corev1.PersistentVolumeReclaimRetain))
	image := filepath.Join(c.SharedDir, pv+".img")
	mountpoint := ginkgo.GinkgoT().TempDir()
	_, err = Run(ctx, "mount", "-o", "ro,loop", image, mountpoint)
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "mounting the kept volume's image %s", image)
	data, readErr := os.ReadFile(filepath.Join(mountpoint, "file"))
	_, err = Run(ctx, "umount", mountpoint)
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	gomega.Expect(readErr).NotTo(gomega.HaveOccurred())
	gomega.Expect(string(data)).To(gomega.Equal("kept\n"), "the provisioned volume's data")

	ginkgo.By("flexd deployed again, the records restored, the kept volume deleted through it")
	c.ApplyAllManifests(ctx, "flexd-uninstall-redeploy")
	c.MustKubectl(ctx, "create", "-f", records)
	c.MustKubectl(ctx, "patch", "pv", pv, "-p", `{"spec":{"persistentVolumeReclaimPolicy":"Delete"}}`)
	WaitFor(ctx, 180*time.Second, "the kept volume "+pv+" deleted", func(ctx context.Context) error {
		_, err := c.Kube.CoreV1().PersistentVolumes().Get(ctx, pv, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("PV %s is still there (%v)", pv, err)
	})
	gomega.Expect(image).NotTo(gomega.BeAnExistingFile(), "the kept volume's image after its deletion")
}
