"""Opcode handlers: building, extending and unpacking tuples, lists, sets, dicts and strings.

Containers built inside the frame are plain Python objects holding real values; they carry no
source, so nothing is guarded about them (what they hold was guarded when it was read).
"""

from __future__ import annotations

from .bytecode import opcode


def _pop_n(frame, n):
    if n == 0:
        return []
    items = frame.stack[-n:]
    del frame.stack[-n:]
    return items


@opcode("BUILD_TUPLE")
def op_build_tuple(interp, frame, inst):
    frame.stack.append(tuple(_pop_n(frame, inst.arg)))


@opcode("BUILD_LIST")
def op_build_list(interp, frame, inst):
    frame.stack.append(_pop_n(frame, inst.arg))


@opcode("BUILD_SET")
def op_build_set(interp, frame, inst):
    frame.stack.append(set(_pop_n(frame, inst.arg)))


@opcode("BUILD_MAP")
def op_build_map(interp, frame, inst):
    items = _pop_n(frame, 2 * inst.arg)
    frame.stack.append({items[i]: items[i + 1] for i in range(0, len(items), 2)})


@opcode("BUILD_CONST_KEY_MAP")
def op_build_const_key_map(interp, frame, inst):
    keys = frame.stack.pop()
    values = _pop_n(frame, inst.arg)
    frame.stack.append(dict(zip(keys, values)))


@opcode("BUILD_STRING")
def op_build_string(interp, frame, inst):
    frame.stack.append("".join(_pop_n(frame, inst.arg)))


@opcode("LIST_APPEND")
def op_list_append(interp, frame, inst):
    v = frame.stack.pop()
    frame.stack[-inst.arg].append(v)


@opcode("SET_ADD")
def op_set_add(interp, frame, inst):
    v = frame.stack.pop()
    frame.stack[-inst.arg].add(v)


@opcode("MAP_ADD")
def op_map_add(interp, frame, inst):
    value = frame.stack.pop()
    key = frame.stack.pop()
    frame.stack[-inst.arg][key] = value


@opcode("LIST_EXTEND")
def op_list_extend(interp, frame, inst):
    seq = frame.stack.pop()
    frame.stack[-inst.arg].extend(seq)


@opcode("SET_UPDATE")
def op_set_update(interp, frame, inst):
    seq = frame.stack.pop()
    frame.stack[-inst.arg].update(seq)


@opcode("DICT_UPDATE")
def op_dict_update(interp, frame, inst):
    other = frame.stack.pop()
    target = frame.stack[-inst.arg]
    interp.tracer.float_slots.escape(other)
    try:
        target.update(other)
    except (TypeError, AttributeError):
        raise TypeError(f"'{type(other).__name__}' object is not a mapping") from None


@opcode("DICT_MERGE")
def op_dict_merge(interp, frame, inst):
    other = frame.stack.pop()
    target = frame.stack[-inst.arg]
    interp.tracer.float_slots.escape(other)  # `f(**group)`: its values become plain numbers
    for k in other.keys():
        if k in target:
            raise TypeError(f"got multiple values for keyword argument '{k}'")
        target[k] = other[k]


@opcode("LIST_TO_TUPLE", until=(3, 12))
def op_list_to_tuple(interp, frame, inst):
    frame.stack.append(tuple(frame.stack.pop()))


@opcode("UNPACK_SEQUENCE")
def op_unpack_sequence(interp, frame, inst):
    seq = frame.stack.pop()
    items = list(seq)
    if len(items) != inst.arg:
        if len(items) > inst.arg:
            raise ValueError(f"too many values to unpack (expected {inst.arg})")
        raise ValueError(f"not enough values to unpack (expected {inst.arg}, got {len(items)})")
    frame.stack.extend(reversed(items))


@opcode("UNPACK_EX")
def op_unpack_ex(interp, frame, inst):
    before, after = inst.arg & 0xFF, inst.arg >> 8
    items = list(frame.stack.pop())
    if len(items) < before + after:
        raise ValueError(
            f"not enough values to unpack (expected at least {before + after}, got {len(items)})"
        )
    head = items[:before]
    tail = items[len(items) - after :] if after else []
    middle = items[before : len(items) - after]
    frame.stack.extend(reversed([*head, middle, *tail]))


# ---- strings -----------------------------------------------------------------------------------
_CONVERSIONS = {0: None, 1: str, 2: repr, 3: ascii}


@opcode("FORMAT_VALUE", until=(3, 13))
def op_format_value(interp, frame, inst):
    spec = frame.stack.pop() if inst.arg & 0x04 else ""
    value = frame.stack.pop()
    if interp.tracer.np_traced:
        from .numpy_trace import data_read

        data_read(interp, value, "formatting")
    conv = _CONVERSIONS[inst.arg & 0x03]
    if conv is not None:
        value = conv(value)
    frame.stack.append(format(value, spec))


@opcode("FORMAT_SIMPLE", since=(3, 13))
def op_format_simple(interp, frame, inst):
    if interp.tracer.np_traced:
        from .numpy_trace import data_read

        data_read(interp, frame.stack[-1], "formatting")
    frame.stack.append(format(frame.stack.pop(), ""))


@opcode("FORMAT_WITH_SPEC", since=(3, 13))
def op_format_with_spec(interp, frame, inst):
    spec = frame.stack.pop()
    frame.stack.append(format(frame.stack.pop(), spec))


@opcode("CONVERT_VALUE", since=(3, 13))
def op_convert_value(interp, frame, inst):
    frame.stack.append(_CONVERSIONS[inst.arg](frame.stack.pop()))
