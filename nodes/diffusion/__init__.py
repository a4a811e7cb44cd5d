"""Sampling in sigma space, as ComfyUI (k-diffusion style) does it: pure torch/numpy/scipy/torchsde.

This package knows nothing of model families, nodes or the engine; the guider and the nodes sit on
top of it. Modules (import them directly; nothing is imported with the package):

- ``model_sampling``: :class:`ModelSampling` = prediction (eps, v, x0, const/flow, EDM, LCM; defined in
  ``predictions``) over a sigma schedule (discrete betas incl. zsnr, LCM distilled, continuous EDM/V,
  flow with shift, Flux; defined in ``sigma_schedules``); constructors ``discrete``, ``flow``, ``flux``...
- ``schedulers``: ``calculate_sigmas(model_sampling, name, steps)`` for ComfyUI's 9 scheduler names,
  the scheduler-node functions (karras, exponential, polyexponential, vp, laplace, beta, AYS, GITS,
  optimal steps, SDTurbo; the AYS, GITS and optimal-steps noise levels are ``data/*.json``, read once)
  and ``ksampler_sigmas`` (KSampler's steps/denoise rules).
- ``noise``: ``prepare_noise`` (initial noise), ``default_noise_sampler`` (seed + 1 per-step noise),
  ``BrownianTreeNoiseSampler`` (torchsde; SDE samplers), ``SeedGroups`` (coalesced runs).
- ``k_samplers``: shared helpers (``report``, ``to_d``, ``get_ancestral_step``, half-log-SNR,
  ``with_post_cfg``, ``capture_uncond``, ``noisy_run``, ...).
- The samplers: ``k_euler`` (euler, heun, lms, ddpm, lcm, ...), ``k_dpm`` (dpm_2, dpm_fast, dpm_adaptive),
  ``k_dpmpp`` (DPM-Solver++ incl. the SDE ones), ``k_cfgpp`` (CFG++ variants), ``k_multistep`` (ipndm,
  deis with ``k_deis``, res_multistep, gradient_estimation), ``k_seeds`` (er_sde, SEEDS, exp_heun_2_x0),
  ``sa_solver``, ``uni_pc``.
- ``sampler_table``: ``SAMPLERS``, every sampler function by ComfyUI name (43).
- ``ksampler``: :class:`KSamplerFn` (ComfyUI's KSAMPLER: noise scaling, inpainting, the call) and
  ``sampler_object(name)`` / ``ksampler(name, ...)``.
- ``names``: ``KSAMPLER_NAMES`` (41), ``SAMPLER_NAMES`` (44), ``SCHEDULER_NAMES`` (9).

Conventions every sampler follows
---------------------------------
``fn(model, x, sigmas, extra_args=None, callback=None, disable=None, **options) -> x``

- ``model(x, sigma_batch, **extra_args)`` returns the **denoised** (x0) prediction for ``x`` at noise
  level ``sigma_batch`` (shape ``[B]``, ``sigma * x.new_ones([B])``). ``model.model_sampling`` is the
  :class:`~nodes.diffusion.model_sampling.ModelSampling`; samplers branch on flow ("CONST") models with
  ``k_samplers.is_flow(model)``.
- ``x`` enters already noised (``x = latent + sigma_0 * noise`` or the flow mix) and leaves as the
  sample at ``sigmas[-1]``. ``sigmas`` is a float32 1-D tensor, descending, usually ending in 0.
- ``extra_args`` is passed through to every model call; it holds ``"seed"`` (int or None: the noise
  seed for per-step noise, ``default_noise_sampler(x, seed)`` draws with seed + 1 on CPU; Brownian
  trees use the seed itself; or ``noise.SeedGroups`` for several runs coalesced into one batch, which
  every noise source here draws per run; samplers only pass the seed on, never compute with it),
  ``"model_options"`` (dict) and, set by :class:`KSamplerFn`, ``"denoise_mask"``. A sampler that needs
  changed model options copies ``extra_args`` first.
- ``callback`` (may be None) receives one dict per step, after the step's first model evaluation:
  ``{"x": x, "i": i, "sigma": sigmas[i], "sigma_hat": sigma_hat, "denoised": denoised}``.
- ``disable`` is accepted and ignored (progress is reported through the callback).
- CFG++ samplers need the unconditional prediction. As in ComfyUI they append a function to
  ``model_options["sampler_post_cfg_function"]`` (``k_samplers.with_post_cfg``). The guider calls each
  such function with a dict holding at least ``"denoised"`` (the CFG result), ``"cond_denoised"``,
  ``"uncond_denoised"``, ``"sigma"``, ``"input"`` (x), ``"cond_scale"``, ``"model_options"``, and uses
  its return value as the denoised output. ``model_options["disable_cfg1_optimization"] = True`` makes
  the guider evaluate the uncond branch even at cfg 1 (otherwise ``uncond_denoised`` is None there).
"""
