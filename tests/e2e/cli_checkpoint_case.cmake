# The checkpoint command lines a new user tries (issue 39), through `zeroshard` (cmake -P):
#   - `train --load DIR/global_step3` (a tag directory) and `--load DIR --load-tag TAG` resume that tag;
#   - `checkpoint compare` of a 2-rank ZeRO-0 save and a 1-rank ZeRO-3 save of the same run says equal
#     (exit 0), the world size and stage reported as layout lines;
#   - `checkpoint inspect --config` with `"gradient_clipping": 1` against the saved 1.0: no difference;
#   - a corrupt `latest` (a byte that is not UTF-8) is quoted escaped (\xe5), never raw.
#   -DMPIEXEC=... -DTOOL=... -DCONFIG=gpt_tiny.json -DOUT=dir
cmake_minimum_required(VERSION 3.25)
set(work ${OUT}/cli_checkpoint)
file(REMOVE_RECURSE ${work})
file(MAKE_DIRECTORY ${work})

function(_zs_run expect_rc out_var)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 120)
  list(JOIN ARGN " " shown)
  message("$ ${shown}\nexit ${rc}\n${out}${err}")
  if(NOT rc STREQUAL "${expect_rc}")
    message(FATAL_ERROR "exit ${rc}, expected ${expect_rc}: ${shown}")
  endif()
  set(${out_var} "${out}${err}" PARENT_SCOPE)
endfunction()
function(_zs_expect text regex)
  if(NOT text MATCHES "${regex}")
    message(FATAL_ERROR "the output does not match '${regex}'")
  endif()
endfunction()

file(READ ${CONFIG} text)
string(JSON stage3 SET "${text}" zero_optimization stage 3)
file(WRITE ${work}/stage3.json "${stage3}")
string(JSON clip_int SET "${text}" gradient_clipping 1)
file(WRITE ${work}/clip_int.json "${clip_int}")

_zs_run(0 log ${MPIEXEC} --oversubscribe -np 2 ${TOOL} train --config ${CONFIG} --steps 3 --save ${work}/a)
_zs_run(0 log ${TOOL} train --config ${work}/stage3.json --steps 3 --save ${work}/b)

# The same run at 2 ranks stage 0 and 1 rank stage 3: equal within rounding; layout is information.
_zs_run(0 log ${TOOL} checkpoint compare ${work}/a ${work}/b --rtol 1e-3 --atol 1e-6)
_zs_expect("${log}" "layout: scalar world_size: 2 in A, 1 in B\nlayout: scalar zero.stage: 0 in A, 3 in B\nequal: [0-9]+ tensor buffers compared .*2 layout difference")
# A real difference still counts: step 3 against step 4.
_zs_run(0 log ${TOOL} train --config ${work}/stage3.json --steps 4 --save ${work}/c)
_zs_run(1 log ${TOOL} checkpoint compare ${work}/a ${work}/c --rtol 1e-3 --atol 1e-6)
_zs_expect("${log}" "scalar global_step: 3 in A, 4 in B.*DIFFERENT")

# A tag directory, and --load-tag.
_zs_run(0 log ${TOOL} train --config ${work}/stage3.json --steps 4 --load ${work}/a/global_step3/)
_zs_expect("${log}" "checkpoint: loaded [^\n]*a/global_step3 \\(step 3, saved at 2 rank")
_zs_run(0 log ${TOOL} train --config ${work}/stage3.json --steps 4 --load ${work}/b --load-tag global_step3)
_zs_expect("${log}" "checkpoint: loaded [^\n]*b/global_step3 \\(step 3, saved at 1 rank")
_zs_run(2 log ${TOOL} train --config ${work}/stage3.json --load-tag global_step3)
_zs_expect("${log}" "--load-tag needs --load DIR")

# 1 and 1.0 are one number.
_zs_run(0 log ${TOOL} checkpoint inspect ${work}/a --config ${work}/clip_int.json)
_zs_expect("${log}" "config: 0 difference")

# A corrupt `latest`: the byte 0xe5 is shown as \xe5 by train and by inspect.
file(COPY ${work}/a/ DESTINATION ${work}/corrupt)
execute_process(COMMAND printf "global_st\\345p4" OUTPUT_FILE ${work}/corrupt/latest)
_zs_run(1 log ${TOOL} train --config ${CONFIG} --steps 4 --load ${work}/corrupt)
_zs_expect("${log}" "checkpoint tag 'global_st\\\\xe5p4' not found")
_zs_run(2 log ${TOOL} checkpoint inspect ${work}/corrupt)
_zs_expect("${log}" "checkpoint tag 'global_st\\\\xe5p4' not found")
message("cli checkpoint case ok")
