// Package controllers groups the guestnet reconcilers, one package per controller:
// guestingress and guestwebhookbridge.
//
// This file carries the RBAC the manager itself needs rather than a controller, because
// `make generate` reads RBAC markers from ./controllers/... only.
package controllers

// The secure diagnostics endpoint (--diagnostics-address without --insecure-diagnostics)
// authenticates and authorizes its callers through the API server.
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create
