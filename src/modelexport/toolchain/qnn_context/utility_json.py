"""A context binary's description in the JSON schema of QAIRT's `qnn-context-binary-utility
--json_file` (`inspect --json --schema qnn`), built from what `reader` read through libQnnSystem.

Field names are the utility's (those of the QnnSystemContext / QnnTypes / QnnHtpSystemContext
structs: `graphName`, `graphInputs`, `dataType`, `quantizeParams.scaleOffset`, `graphBlobInfo`,
`contextMetadata.info.dspArch` ...); versioned structs are `{"version": ..., "info": {...}}` as
there, so scripts written against the utility read ours with the same paths:

    .info.graphs[0].info.graphOutputs[0].info.dimensions

Seed 003 reads `.info.graphs[0].graphOutputs[0]` (without the graph's `info`); each graph entry
also carries `graphName`, `graphInputs` and `graphOutputs` at its top level so that path works too.
Only what the binary holds is written: no `memType` / `clientBuf` (a binary has no buffers).
"""
from __future__ import annotations

from typing import Any


def _quantize_params(q: dict | None) -> dict[str, Any]:
    if not q:
        return {"definition": "QNN_DEFINITION_UNDEFINED", "quantizationEncoding": "QNN_QUANTIZATION_ENCODING_UNDEFINED"}
    out: dict[str, Any] = {"definition": f"QNN_DEFINITION_{q['definition']}",
                           "quantizationEncoding": f"QNN_QUANTIZATION_ENCODING_{q['encoding']}"}
    enc = q["encoding"]
    if enc == "SCALE_OFFSET":
        out["scaleOffset"] = {"scale": q["scale"], "offset": q["offset"]}
    elif enc == "BW_SCALE_OFFSET":
        out["bwScaleOffset"] = {"bitwidth": q["bitwidth"], "scale": q["scale"], "offset": q["offset"]}
    elif enc == "AXIS_SCALE_OFFSET" and q.get("scales") is not None:
        out["axisScaleOffset"] = {"axis": q["axis"], "numScaleOffsets": len(q["scales"]),
                                  "scaleOffsets": [{"scale": s, "offset": o} for s, o in zip(q["scales"], q["offsets"])]}
    elif enc == "BW_AXIS_SCALE_OFFSET" and q.get("scales") is not None:
        out["bwAxisScaleOffset"] = {"bitwidth": q["bitwidth"], "axis": q["axis"], "numElements": len(q["scales"]),
                                    "scales": q["scales"], "offsets": q["offsets"]}
    return out


def _tensor(t: dict) -> dict[str, Any]:
    info: dict[str, Any] = {"id": t["id"], "name": t["name"], "type": f"QNN_TENSOR_TYPE_{t['tensor_type']}",
                            "dataFormat": t["data_format"], "dataType": f"QNN_DATATYPE_{t['dtype']}",
                            "quantizeParams": _quantize_params(t.get("quantization")),
                            "rank": len(t["shape"]), "dimensions": list(t["shape"])}
    if t.get("dynamic_dims") is not None:
        info["isDynamicDimensions"] = [int(d) for d in t["dynamic_dims"]]
    return {"version": f"QNN_TENSOR_VERSION_{t.get('tensor_version', 1)}", "info": info}


def _blob_info(h: dict | None) -> dict[str, Any]:
    if not h:
        return {}
    out: dict[str, Any] = {}
    if 1 in h.get("record_versions", []):
        out["graphBlobInfo"] = {"version": 1, "info": {
            "spillFillBufferSize": h["spill_fill_buffer_size"], "vtcmSize": h["vtcm_bytes"],
            "optimizationLevel": h["optimization_level"], "htpDlbc": h["htp_dlbc"], "numHvxThreads": h["num_hvx_threads"]}}
    if 2 in h.get("record_versions", []):
        out["graphBlobInfoV2"] = {
            "version": 2, "nativeKChannelSize": h["native_k_channel_size"], "nativeVChannelSize": h["native_v_channel_size"],
            "isSafeShareIO": int(bool(h["is_safe_share_io"])), "ioTensorSize": h["io_tensor_size"],
            "opDataSize": h["op_data_size"], "constSize": h["const_size"], "ddrTensorSize": h["ddr_tensor_size"],
            "sharedWeightsSize": h["shared_weights_size"]}
    return out


def _graph(g: dict) -> dict[str, Any]:
    inputs, outputs = [_tensor(t) for t in g["inputs"]], [_tensor(t) for t in g["outputs"]]
    info: dict[str, Any] = {"graphName": g["name"], "numGraphInputs": len(inputs), "graphInputs": inputs,
                            "numGraphOutputs": len(outputs), "graphOutputs": outputs}
    if g.get("updateable_tensors"):
        info["numUpdateableTensors"] = len(g["updateable_tensors"])
        info["updateableTensors"] = [_tensor(t) for t in g["updateable_tensors"]]
    info.update(_blob_info(g.get("htp")))
    # the seed's path (.graphs[0].graphOutputs[0]) beside the utility's (.graphs[0].info.graphOutputs[0])
    return {"version": f"QNN_SYSTEM_CONTEXT_GRAPH_INFO_VERSION_{g['graph_info_version']}", "info": info,
            "graphName": g["name"], "graphInputs": inputs, "graphOutputs": outputs}


def utility_json(binary: dict) -> dict[str, Any]:
    """`ContextBinaryInfo.to_dict()` → qnn-context-binary-utility's JSON layout."""
    info: dict[str, Any] = {
        "backendId": binary["backend_id"], "buildId": binary["build_id"],
        "coreApiVersion": binary["core_api_version"], "backendApiVersion": binary["backend_api_version"],
        "socVersion": binary.get("soc_version") or "", "contextBlobVersion": binary["context_blob_version"],
        "contextBlobSize": binary["context_blob_size"],
        "numContextTensors": len(binary.get("context_tensors", [])),
        "contextTensors": [_tensor(t) for t in binary.get("context_tensors", [])],
        "numGraphs": len(binary["graphs"]), "graphs": [_graph(g) for g in binary["graphs"]]}
    if binary.get("soc_model") is not None:
        info["socModel"] = binary["soc_model"]
    if binary.get("dsp_arch") is not None:
        info["contextMetadata"] = {"version": 1, "info": {"dspArch": binary["dsp_arch"]}}
    return {"version": f"QNN_SYSTEM_CONTEXT_BINARY_INFO_VERSION_{binary['binary_info_version']}", "info": info}
