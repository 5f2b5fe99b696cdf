//go:build tools

// The packages that the tests of sigs.k8s.io/karpenter/pkg/controllers/provisioning/scheduling import
// (with the test_performance tag), so that go mod tidy keeps their modules in go.mod and go.sum:
// scripts/bench-vs-karpenter.sh compiles that test package, which this module does not import otherwise.
// Never built.
package karpenterbench

import (
	_ "github.com/awslabs/operatorpkg/status"
	_ "github.com/mitchellh/hashstructure/v2"
	_ "github.com/onsi/ginkgo/v2"
	_ "github.com/onsi/gomega"
	_ "github.com/prometheus/client_model/go"
	_ "github.com/samber/lo"
	_ "k8s.io/api/core/v1"
	_ "k8s.io/api/node/v1"
	_ "k8s.io/api/policy/v1"
	_ "k8s.io/api/storage/v1"
	_ "k8s.io/apimachinery/pkg/api/resource"
	_ "k8s.io/apimachinery/pkg/apis/meta/v1"
	_ "k8s.io/apimachinery/pkg/util/intstr"
	_ "k8s.io/apimachinery/pkg/util/sets"
	_ "k8s.io/apimachinery/pkg/util/uuid"
	_ "k8s.io/client-go/kubernetes/scheme"
	_ "k8s.io/client-go/tools/record"
	_ "k8s.io/cloud-provider/api"
	_ "k8s.io/csi-translation-lib/plugins"
	_ "k8s.io/utils/clock"
	_ "sigs.k8s.io/controller-runtime/pkg/client"
	_ "sigs.k8s.io/controller-runtime/pkg/client/fake"
	_ "sigs.k8s.io/controller-runtime/pkg/log"
	_ "sigs.k8s.io/karpenter/pkg/apis"
	_ "sigs.k8s.io/karpenter/pkg/apis/v1"
	_ "sigs.k8s.io/karpenter/pkg/cloudprovider"
	_ "sigs.k8s.io/karpenter/pkg/cloudprovider/fake"
	_ "sigs.k8s.io/karpenter/pkg/controllers/dynamicresources/deviceallocation"
	_ "sigs.k8s.io/karpenter/pkg/controllers/provisioning"
	_ "sigs.k8s.io/karpenter/pkg/controllers/provisioning/scheduling"
	_ "sigs.k8s.io/karpenter/pkg/controllers/state"
	_ "sigs.k8s.io/karpenter/pkg/controllers/state/informer"
	_ "sigs.k8s.io/karpenter/pkg/events"
	_ "sigs.k8s.io/karpenter/pkg/operator/injection"
	_ "sigs.k8s.io/karpenter/pkg/operator/logging"
	_ "sigs.k8s.io/karpenter/pkg/operator/options"
	_ "sigs.k8s.io/karpenter/pkg/scheduling"
	_ "sigs.k8s.io/karpenter/pkg/state/cost"
	_ "sigs.k8s.io/karpenter/pkg/state/virtualpods"
	_ "sigs.k8s.io/karpenter/pkg/test"
	_ "sigs.k8s.io/karpenter/pkg/test/expectations"
	_ "sigs.k8s.io/karpenter/pkg/test/v1alpha1"
	_ "sigs.k8s.io/karpenter/pkg/utils/resources"
	_ "sigs.k8s.io/karpenter/pkg/utils/testing"
)
