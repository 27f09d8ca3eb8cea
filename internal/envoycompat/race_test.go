//go:build race

package envoycompat

// raceBuild: this test binary runs under the race detector, so quotad is
// built with it too; the packages the race-enabled tests compiled are
// then reused from the build cache instead of compiled again.
const raceBuild = true
