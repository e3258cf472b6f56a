//! The `main` of the GPU test binaries (`cuda_backend`, and `cuda_models`
//! in infer-model, which includes this file by path): each test is a
//! libtest-mimic trial that runs when a CUDA device was found, is reported
//! as ignored with the reason when none was, and fails instead under
//! `INFER_REQUIRE_CUDA=1`.

/// Runs `tests` (name, test function) and exits; `unavailable` is why
/// there is no device, or `None` when there is one.
pub fn run(tests: Vec<(&'static str, fn())>, unavailable: Option<String>) -> ! {
    let args = libtest_mimic::Arguments::from_args();
    let required = std::env::var("INFER_REQUIRE_CUDA").as_deref() == Ok("1");
    let trials = tests
        .into_iter()
        .map(|(name, f)| {
            let why = unavailable.clone();
            libtest_mimic::Trial::ignorable_test(name, move || match why {
                None => {
                    f();
                    Ok(libtest_mimic::Completion::Completed)
                }
                Some(why) if required => Err(format!("INFER_REQUIRE_CUDA=1: {why}").into()),
                Some(why) => Ok(libtest_mimic::Completion::ignored_with(why)),
            })
        })
        .collect();
    libtest_mimic::run(&args, trials).exit()
}
