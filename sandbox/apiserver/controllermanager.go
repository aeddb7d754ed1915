package main

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/informers"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	restclient "k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/keyutil"
	"k8s.io/controller-manager/pkg/informerfactory"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/controller/garbagecollector"
	namespacecontroller "k8s.io/kubernetes/pkg/controller/namespace"
	serviceaccountcontroller "k8s.io/kubernetes/pkg/controller/serviceaccount"
	"k8s.io/kubernetes/pkg/serviceaccount"
)

// kcmControllers are the only controllers run, each built from its own package as
// kube-controller-manager builds it, with its default settings. Deployments and ReplicaSets
// are deliberately absent: the project's pod runner plays those, and a real deployment
// controller would fight it over ReplicaSets and status.
//
// The controllers are built here rather than through kube-controller-manager's app package:
// that package links every controller Kubernetes has (volumes, nodes, the scheduler's and the
// kubelet's packages it shares, cadvisor), 387 packages beside the apiserver's, where these
// four need 66 (`go list -deps`, Kubernetes 1.36.3), and the apiserver is the largest build
// of `make tools`.
var kcmControllers = []string{
	"garbage-collector-controller",
	"namespace-controller",
	"serviceaccount-controller",
	"serviceaccount-token-controller",
}

// kube-controller-manager's defaults for what these controllers take.
const (
	kcmQPS   = 20 // --kube-api-qps
	kcmBurst = 30 // --kube-api-burst
	// --min-resync-period: shared informers resync between it and twice it.
	kcmMinResync = 12 * time.Hour
	// --concurrent-gc-syncs, --concurrent-namespace-syncs, --namespace-sync-period,
	// --concurrent-serviceaccount-token-syncs.
	gcWorkers           = 20
	namespaceWorkers    = 10
	namespaceSyncPeriod = 5 * time.Minute
	tokenWorkers        = 5
	// How often the garbage collector rereads discovery for new resources (and the REST
	// mapper is reset), as kube-controller-manager does.
	discoveryPeriod = 30 * time.Second
)

// controllerManager is the configured set of controllers; it contacts nothing until run.
type controllerManager struct {
	config *restclient.Config
	saKey  any
	rootCA []byte
}

// newControllerManager reads the controllers' client configuration and the service-account
// signing key, so that a bad file fails at once.
func newControllerManager(p *pki) (*controllerManager, error) {
	config, err := clientcmd.BuildConfigFromFlags("", p.path(kcmKubeconfigFile))
	if err != nil {
		return nil, fmt.Errorf("controller-manager kubeconfig: %w", err)
	}
	config.QPS, config.Burst = kcmQPS, kcmBurst
	key, err := keyutil.PrivateKeyFromFile(p.path(saKeyFile))
	if err != nil {
		return nil, fmt.Errorf("service-account signing key: %w", err)
	}
	rootCA, err := os.ReadFile(p.path(caCertFile))
	if err != nil {
		return nil, fmt.Errorf("root CA: %w", err)
	}
	return &controllerManager{config: config, saKey: key, rootCA: rootCA}, nil
}

// clientConfig is the controllers' configuration named for one of them (its user agent),
// with its request rates scaled as kube-controller-manager scales them.
func (m *controllerManager) clientConfig(name string, qps, burst float32) *restclient.Config {
	c := restclient.CopyConfig(m.config)
	restclient.AddUserAgent(c, "kube-controller-manager/"+name)
	c.QPS *= qps
	c.Burst = int(float32(c.Burst) * burst)
	return c
}

// run builds the controllers, starts their informers and runs them until ctx is cancelled.
func (m *controllerManager) run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	shared, err := clientset.NewForConfig(m.clientConfig("shared-informers", 1, 1))
	if err != nil {
		return fmt.Errorf("shared informers' client: %w", err)
	}
	resync := wait.Jitter(kcmMinResync, 1.0)
	sharedInformers := informers.NewSharedInformerFactory(shared, resync)
	metadataClient, err := metadata.NewForConfig(m.clientConfig("metadata-informers", 1, 1))
	if err != nil {
		return fmt.Errorf("metadata informers' client: %w", err)
	}
	metadataInformers := metadatainformer.NewSharedInformerFactory(metadataClient, resync)
	informersStarted := make(chan struct{})

	var loops []func(context.Context)

	// The token controller comes first, as in kube-controller-manager.
	tokenClient, err := clientset.NewForConfig(m.clientConfig("tokens-controller", 1, 1))
	if err != nil {
		return fmt.Errorf("tokens controller's client: %w", err)
	}
	generator, err := serviceaccount.JWTTokenGenerator(serviceaccount.LegacyIssuer, m.saKey)
	if err != nil {
		return fmt.Errorf("service-account token generator: %w", err)
	}
	tokens, err := serviceaccountcontroller.NewTokensController(logger,
		sharedInformers.Core().V1().ServiceAccounts(), sharedInformers.Core().V1().Secrets(),
		tokenClient, serviceaccountcontroller.TokensControllerOptions{TokenGenerator: generator, RootCA: m.rootCA})
	if err != nil {
		return fmt.Errorf("tokens controller: %w", err)
	}
	loops = append(loops, func(ctx context.Context) { tokens.Run(ctx, tokenWorkers) })

	saClient, err := clientset.NewForConfig(m.clientConfig("service-account-controller", 1, 1))
	if err != nil {
		return fmt.Errorf("service-account controller's client: %w", err)
	}
	serviceAccounts, err := serviceaccountcontroller.NewServiceAccountsController(logger,
		sharedInformers.Core().V1().ServiceAccounts(), sharedInformers.Core().V1().Namespaces(),
		saClient, serviceaccountcontroller.DefaultServiceAccountsControllerOptions())
	if err != nil {
		return fmt.Errorf("service-account controller: %w", err)
	}
	loops = append(loops, func(ctx context.Context) { serviceAccounts.Run(ctx, 1) })

	// The namespace controller deletes everything in a namespace with many calls; kube-controller-manager
	// raises its rates 20 and 100 times.
	nsConfig := m.clientConfig("namespace-controller", 20, 100)
	nsClient, err := clientset.NewForConfig(nsConfig)
	if err != nil {
		return fmt.Errorf("namespace controller's client: %w", err)
	}
	nsMetadata, err := metadata.NewForConfig(nsConfig)
	if err != nil {
		return fmt.Errorf("namespace controller's metadata client: %w", err)
	}
	namespaces := namespacecontroller.NewNamespaceController(ctx, nsClient, nsMetadata,
		nsClient.Discovery().ServerPreferredNamespacedResources,
		sharedInformers.Core().V1().Namespaces(), namespaceSyncPeriod, v1.FinalizerKubernetes)
	loops = append(loops, func(ctx context.Context) { namespaces.Run(ctx, namespaceWorkers) })

	// The garbage collector: two calls a deletion, so twice the rate.
	gcConfig := m.clientConfig("generic-garbage-collector", 2, 1)
	gcClient, err := clientset.NewForConfig(gcConfig)
	if err != nil {
		return fmt.Errorf("garbage collector's client: %w", err)
	}
	gcMetadata, err := metadata.NewForConfig(gcConfig)
	if err != nil {
		return fmt.Errorf("garbage collector's metadata client: %w", err)
	}
	restMapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(gcClient.Discovery()))
	gc, err := garbagecollector.NewGarbageCollector(ctx, gcClient, gcMetadata, restMapper,
		garbagecollector.DefaultIgnoredResources(),
		informerfactory.NewInformerFactory(sharedInformers, metadataInformers), informersStarted)
	if err != nil {
		return fmt.Errorf("garbage collector: %w", err)
	}
	loops = append(loops,
		func(ctx context.Context) { wait.Until(restMapper.Reset, discoveryPeriod, ctx.Done()) },
		func(ctx context.Context) { gc.Run(ctx, gcWorkers, discoveryPeriod) },
		func(ctx context.Context) { gc.Sync(ctx, gcClient.Discovery(), discoveryPeriod) },
	)

	var running sync.WaitGroup
	for _, loop := range loops {
		running.Go(func() { loop(ctx) })
	}
	sharedInformers.Start(ctx.Done())
	metadataInformers.Start(ctx.Done())
	close(informersStarted)
	klog.InfoS("Controllers started", "controllers", kcmControllers)
	running.Wait()
	sharedInformers.Shutdown()
	metadataInformers.Shutdown()
	return nil
}
