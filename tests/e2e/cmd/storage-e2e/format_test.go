//go:build !before_1_37 && !since_1_38

package storagee2e

// Gomega's formatting of Kubernetes objects, as e2e.test sets it up. 1.38 moved it to its own
// module, k8s.io/ktesting, which the module proxy does not serve: that suite runs without it.
import _ "k8s.io/kubernetes/test/utils/ktesting/format"
