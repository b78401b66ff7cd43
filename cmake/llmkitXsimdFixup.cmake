# SPDX-License-Identifier: MIT
# Debian bookworm's xsimd 8.1 package lists `xtl` as a link dependency of the
# imported `xsimd` target, but its config never finds xtl, so every link fails
# with "cannot find -lxtl". xsimd itself does not need xtl: strip it.
if(TARGET xsimd)
  get_target_property(_llmkit_xsimd_libs xsimd INTERFACE_LINK_LIBRARIES)
  if(_llmkit_xsimd_libs)
    list(REMOVE_ITEM _llmkit_xsimd_libs xtl)
    set_target_properties(xsimd PROPERTIES INTERFACE_LINK_LIBRARIES "${_llmkit_xsimd_libs}")
  endif()
  unset(_llmkit_xsimd_libs)
endif()
