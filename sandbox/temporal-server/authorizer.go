package main

import (
	"context"

	commonpb "go.temporal.io/api/common/v1"
	"go.temporal.io/server/common/api"
	"go.temporal.io/server/common/authorization"
)

// workerAwareAuthorizer is the server's default authorizer plus a meaning for the `worker`
// role, which the default authorizer ranks below `read` and so grants nothing: a principal with
// the worker role in a namespace may do what a worker process does there (read, poll task
// queues, complete and heartbeat tasks, report itself) and nothing else. Notably it may not
// start, signal or terminate workflows, nor change a worker deployment's routing
// (SetWorkerDeploymentCurrentVersion needs `write`): a worker's credential cannot promote.
type workerAwareAuthorizer struct {
	base authorization.Authorizer
}

// workerAPIs are the write APIs a worker needs, by method name.
var workerAPIs = map[string]bool{
	"PollWorkflowTaskQueue":            true,
	"RespondWorkflowTaskCompleted":     true,
	"RespondWorkflowTaskFailed":        true,
	"PollActivityTaskQueue":            true,
	"RecordActivityTaskHeartbeat":      true,
	"RecordActivityTaskHeartbeatById":  true,
	"RespondActivityTaskCompleted":     true,
	"RespondActivityTaskCompletedById": true,
	"RespondActivityTaskFailed":        true,
	"RespondActivityTaskFailedById":    true,
	"RespondActivityTaskCanceled":      true,
	"RespondActivityTaskCanceledById":  true,
	"PollNexusTaskQueue":               true,
	"RespondNexusTaskCompleted":        true,
	"RespondNexusTaskFailed":           true,
	"RespondQueryTaskCompleted":        true,
	"ResetStickyTaskQueue":             true,
	"ShutdownWorker":                   true,
	"RecordWorkerHeartbeat":            true,
}

func newWorkerAwareAuthorizer(base authorization.Authorizer) authorization.Authorizer {
	return &workerAwareAuthorizer{base: base}
}

func (a *workerAwareAuthorizer) Authorize(
	ctx context.Context,
	claims *authorization.Claims,
	target *authorization.CallTarget,
) (authorization.Result, error) {
	result, err := a.base.Authorize(ctx, claims, target)
	if err != nil || result.Decision == authorization.DecisionAllow || claims == nil {
		return result, err
	}
	metadata := api.GetMethodMetadata(target.APIName)
	if metadata.Scope != api.ScopeNamespace {
		return result, nil
	}
	role := claims.System | claims.Namespaces[target.Namespace]
	if role&authorization.RoleWorker == 0 {
		return result, nil
	}
	if metadata.Access == api.AccessReadOnly || workerAPIs[api.MethodName(target.APIName)] {
		return authorization.Result{
			Decision:  authorization.DecisionAllow,
			Principal: &commonpb.Principal{Type: claims.AuthType, Name: claims.Subject},
		}, nil
	}
	return result, nil
}
