//go:build before_1_36

package storagee2e

import imageutils "k8s.io/kubernetes/test/utils/image"

type suiteImage struct {
	name string
	id   imageutils.ImageID
}

// Before 1.36 the multivolume specs' glibc image was jessie-dnsutils (glibc-dns-testing after).
var suiteImages = []suiteImage{{"busybox", imageutils.BusyBox}, {"agnhost", imageutils.Agnhost}, {"nginx", imageutils.Nginx},
	{"pause", imageutils.Pause}, {"glibc-dns-testing", imageutils.JessieDnsutils}}
