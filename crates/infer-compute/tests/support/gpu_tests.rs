//! The `main` of the GPU test binaries (`cuda_backend`, and `cuda_models`
//! and `wgpu_models` in infer-model, which include this file by path): each
//! test is a libtest-mimic trial that runs when a device was found, is
//! reported as ignored with the reason when none was, and fails instead
//! when the binary's variable (`INFER_REQUIRE_CUDA`, `INFER_REQUIRE_WGPU`)
//! is 1.

/// Runs `tests` (name, test function) and exits; `unavailable` is why
/// there is no device, or `None` when there is one; `require_var` is the
/// variable that turns a missing device into a failure.
pub fn run(tests: Vec<(&'static str, fn())>, unavailable: Option<String>, require_var: &str) -> ! {
    let args = libtest_mimic::Arguments::from_args();
    let required = std::env::var(require_var).as_deref() == Ok("1");
    let var = require_var.to_string();
    let trials = tests
        .into_iter()
        .map(|(name, f)| {
            let why = unavailable.clone();
            let var = var.clone();
            libtest_mimic::Trial::ignorable_test(name, move || match why {
                None => {
                    f();
                    Ok(libtest_mimic::Completion::Completed)
                }
                Some(why) if required => Err(format!("{var}=1: {why}").into()),
                Some(why) => Ok(libtest_mimic::Completion::ignored_with(why)),
            })
        })
        .collect();
    libtest_mimic::run(&args, trials).exit()
}
