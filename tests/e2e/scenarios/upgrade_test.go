package scenarios

// The upgrade from a controller that kept its records on a claim (one replica, strategy
// Recreate, `--controller-records=state-dir` on `flexd-controller-state`) to the replicas that
// keep them in the API server, by the steps docs/operator-guide.md#upgrade-state-claim gives.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"
)

const (
	oldStateClaim = "flexd-controller-state"
	upgradeClass  = "flexd-upgrade"
	upgradeClaim  = "upgrade-claim"
)

// scenarioUpgrade: a volume provisioned by the old controller (its record on the claim only)
// is, after the import Job and the new manifests, deleted by the new replicas with the options
// the old one recorded: its image goes, no record is left.
func scenarioUpgrade(ctx context.Context) {
	c := cluster
	ginkgo.By("the old controller: one replica keeping its records on the claim " + oldStateClaim)
	c.InstallLoop(ctx)
	manifests := c.ApplyAllManifests(ctx, "flexd-upgrade")
	ginkgo.DeferCleanup(c.deleteUpgrade)
	old := c.Path("old-controller-state")
	gomega.Expect(os.MkdirAll(old, 0o700)).To(gomega.Succeed())
	c.oldStateClaim(ctx, old)
	c.MustKubectl(ctx, "apply", "-f", c.WriteRun("flexd-old-controller.yaml", oldController(manifests)))
	c.MustKubectl(ctx, "-n", c.Namespace, "rollout", "status", "deployment/flexd-controller", "--timeout=300s")

	ginkgo.By("a volume provisioned by the old controller")
	_, err := c.Kube.StorageV1().StorageClasses().Create(ctx, &storagev1.StorageClass{
		ObjectMeta:  metav1.ObjectMeta{Name: upgradeClass},
		Provisioner: loopCSIName,
	}, metav1.CreateOptions{})
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	c.CreateClaim(ctx, upgradeClaim, upgradeClass, "16Mi")
	c.WaitClaimBound(ctx, upgradeClaim, 180*time.Second)
	claim, err := c.Kube.CoreV1().PersistentVolumeClaims(podNamespace).Get(ctx, upgradeClaim, metav1.GetOptions{})
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	volume := claim.Spec.VolumeName
	image := c.Path("loop-images", volume+".img")
	gomega.Expect(image).To(gomega.BeAnExistingFile(), "the old controller's volume")
	// The volume's record in the state dir (docs/csi.md#controller-records).
	gomega.Expect(filepath.Join(old, "controller", "flexd~loop", volume+".json")).To(gomega.BeAnExistingFile(), "its record on the claim")
	gomega.Expect(c.provisionedRecords(ctx, volume)).To(gomega.Equal(0), "records of %s in the API server before the import", volume)

	ginkgo.By("the upgrade: the old controller stopped, the import Job run, the new manifests applied")
	c.MustKubectl(ctx, "-n", c.Namespace, "scale", "deployment/flexd-controller", "--replicas=0")
	imports := c.MustFlexd(ctx, "manifests", "--import-state-claim", oldStateClaim, "--image", c.FlexdImage, "--namespace", c.Namespace)
	c.MustKubectl(ctx, "apply", "-f", c.WriteRun("flexd-import.yaml", imports))
	c.MustKubectl(ctx, "-n", c.Namespace, "wait", "--for=condition=complete", "job/flexd-import-records", "--timeout=180s")
	logs := c.MustKubectl(ctx, "-n", c.Namespace, "logs", "job/flexd-import-records")
	fmt.Fprintf(ginkgo.GinkgoWriter, "the import Job's log:\n%s", logs)
	gomega.Expect(logs).To(gomega.ContainSubstring("imported 0 attachments and 1 provisioned volumes"))
	gomega.Expect(c.provisionedRecords(ctx, volume)).To(gomega.Equal(1), "records of %s in the API server after the import", volume)
	c.ApplyAllManifests(ctx, "flexd-upgrade")
	gomega.Expect(c.ControllerPods(ctx)).To(gomega.HaveLen(2), "Running controller replicas after the upgrade")

	ginkgo.By("the old volume deleted by the new controller: its image and its record gone")
	gomega.Expect(c.Kube.CoreV1().PersistentVolumeClaims(podNamespace).Delete(ctx, upgradeClaim, metav1.DeleteOptions{})).To(gomega.Succeed())
	WaitFor(ctx, 180*time.Second, "PV "+volume+" to be deleted", func(ctx context.Context) error {
		_, err := c.Kube.CoreV1().PersistentVolumes().Get(ctx, volume, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("PV %s is still there (%v)", volume, err)
	})
	gomega.Expect(image).NotTo(gomega.BeAnExistingFile(), "the volume's image after DeleteVolume")
	gomega.Expect(c.provisionedRecords(ctx, volume)).To(gomega.Equal(0), "records of %s after DeleteVolume", volume)
}

// oldStateClaim is the old controller's claim, on a PV over a host dir (the cluster has no
// default StorageClass), as the manifests before replicas asked for it.
func (c *Cluster) oldStateClaim(ctx context.Context, dir string) {
	ginkgo.GinkgoHelper()
	size := corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}
	_, err := c.Kube.CoreV1().PersistentVolumes().Create(ctx, &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: oldStateClaim},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      size,
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			PersistentVolumeSource: corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{
				Path: dir, Type: ptr.To(corev1.HostPathDirectory),
			}},
			ClaimRef: &corev1.ObjectReference{Namespace: c.Namespace, Name: oldStateClaim},
		},
	}, metav1.CreateOptions{})
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "the old state claim's PV")
	_, err = c.Kube.CoreV1().PersistentVolumeClaims(c.Namespace).Create(ctx, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: oldStateClaim},
		Spec: corev1.PersistentVolumeClaimSpec{
			StorageClassName: ptr.To(""),
			VolumeName:       oldStateClaim,
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:        corev1.VolumeResourceRequirements{Requests: size},
		},
	}, metav1.CreateOptions{})
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "the old state claim")
}

// oldController is the manifests' controller Deployment made the old one: one replica,
// Recreate, its state dir on the old claim, its records there. Applied, as the old manifests
// were, so that applying the new ones later changes it back field by field.
func oldController(manifests string) string {
	ginkgo.GinkgoHelper()
	for _, doc := range strings.Split(manifests, "\n---\n") {
		var deployment appsv1.Deployment
		if yaml.Unmarshal([]byte(doc), &deployment) != nil || deployment.Kind != "Deployment" {
			continue
		}
		deployment.Spec.Replicas = ptr.To[int32](1)
		deployment.Spec.Strategy = appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType}
		pod := &deployment.Spec.Template.Spec
		for i := range pod.Volumes {
			if pod.Volumes[i].Name == "state" {
				pod.Volumes[i].VolumeSource = corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: oldStateClaim}}
			}
		}
		for i := range pod.Containers {
			for j, arg := range pod.Containers[i].Args {
				if arg == "--controller-records=kubernetes" {
					pod.Containers[i].Args[j] = "--controller-records=state-dir"
				}
			}
		}
		out, err := yaml.Marshal(&deployment)
		gomega.Expect(err).NotTo(gomega.HaveOccurred())
		return string(out)
	}
	ginkgo.Fail("no controller Deployment in the manifests")
	return ""
}

// deleteUpgrade deletes what the scenario made, the deployment back to the manifests' own.
func (c *Cluster) deleteUpgrade(ctx context.Context) {
	c.DeleteClaimIfThere(ctx, upgradeClaim)
	_, _ = c.Kubectl(ctx, "-n", c.Namespace, "delete", "--ignore-not-found", "job/flexd-import-records")
	err := c.Kube.StorageV1().StorageClasses().Delete(ctx, upgradeClass, metav1.DeleteOptions{})
	if !apierrors.IsNotFound(err) {
		gomega.Expect(err).NotTo(gomega.HaveOccurred())
	}
	c.ApplyAllManifests(ctx, "flexd-upgrade")
	_, _ = c.Kubectl(ctx, "-n", c.Namespace, "delete", "--ignore-not-found", "--wait=true", "--timeout=120s", "pvc/"+oldStateClaim)
	c.DeletePVIfThere(ctx, oldStateClaim)
	gomega.Expect(os.RemoveAll(c.Path("old-controller-state"))).To(gomega.Succeed())
}
